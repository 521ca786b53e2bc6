"""An `evaluate` metric: exact bits/byte and byte perplexity of texts under a Kathleen model.

    import evaluate
    metric = evaluate.load("scripts/bits_per_byte")          # a local path: works offline
    metric.compute(predictions=["some text", ...], model_id="path/or/hub-id")

Each text is scored as one stream with the separator (eos) before it (`window=None`), or in
independent windows of `window` bytes as lm-evaluation-harness does. Totals are weighted by bytes.
"""

import math

import datasets
import evaluate
import torch

_DESCRIPTION = "Bits per byte and byte perplexity of texts under a Kathleen byte model (kathleen-notebook)."
_KWARGS_DESCRIPTION = """
Args:
    predictions (list of str): the texts to score.
    model_id (str or model): a checkpoint folder, a Hub id, or a loaded KathleenForCausalLM.
    window (int, optional): score in independent windows of this many bytes (state empty at each start).
    chunk_size (int, optional): bytes per forward call of the streaming scorer (memory stays constant).
Returns:
    bits_per_byte: total bits / total bytes; byte_perplexity: 2 ** bits_per_byte;
    bits_per_byte_per_text: one value per text.
"""


@evaluate.utils.file_utils.add_start_docstrings(_DESCRIPTION, _KWARGS_DESCRIPTION)
class BitsPerByte(evaluate.Metric):
    def _info(self):
        return evaluate.MetricInfo(
            description=_DESCRIPTION,
            citation="",
            inputs_description=_KWARGS_DESCRIPTION,
            features=datasets.Features({"predictions": datasets.Value("string")}),
        )

    def _compute(self, predictions, model_id, window=None, chunk_size=4096):
        from transformers import AutoModelForCausalLM

        if not predictions or not all(predictions):  # before a model loads
            raise ValueError("give one or more non-empty texts to score")
        if (window is not None and window < 1) or chunk_size < 1:
            raise ValueError(f"window (None: one stream) and chunk_size are byte counts of at least 1, got {window} "
                             f"and {chunk_size}")
        if isinstance(model_id, str):  # the checkpoint's own remote code: this package need not be installed
            model = AutoModelForCausalLM.from_pretrained(model_id, trust_remote_code=True)
        else:
            model = model_id
        model.eval()
        per_text, total_bits, total_bytes = [], 0.0, 0
        with torch.no_grad():
            for text in predictions:
                bits = text_bits(model, text.encode("utf-8"), window, chunk_size)
                per_text.append(bits.mean().item())
                total_bits, total_bytes = total_bits + bits.sum().item(), total_bytes + bits.numel()
        bpb = total_bits / total_bytes
        return {"bits_per_byte": bpb, "byte_perplexity": 2.0 ** bpb, "bits_per_byte_per_text": per_text}


def text_bits(model, data: bytes, window, chunk_size) -> torch.Tensor:
    """Bits of each byte: the protocol of `modeling_kathleen_notebook.scoring.byte_bits` (tests compare the two),
    written out here so that the metric runs with the remote code alone. Byte b is token b + 3, eos is 1."""
    if not data:
        raise ValueError("cannot score an empty text")
    ids = torch.tensor(list(data)) + 3
    previous = torch.cat([torch.tensor([1]), ids[:-1]])  # the input that predicts each byte: eos, then the text
    if window is None:
        return stream_bits(model, previous, ids, chunk_size)
    full = len(ids) // window * window
    bits = [stream_bits(model, previous[i:i + window], ids[i:i + window], chunk_size) for i in range(0, full, window)]
    if full < len(ids):  # the rest, in the window that ends with the text (lm-eval's last window)
        start = max(0, len(ids) - window)
        bits.append(stream_bits(model, previous[start:], ids[start:], chunk_size)[full - start:])
    return torch.cat(bits)


def stream_bits(model, inputs: torch.Tensor, targets: torch.Tensor, chunk_size: int) -> torch.Tensor:
    """-log2 p(targets[t] | inputs[:t+1]) from an empty state, fed in chunks through the model's cache."""
    cache, bits = None, []
    for start in range(0, len(inputs), chunk_size):
        out = model(inputs[None, start:start + chunk_size].to(model.device), cache=cache, use_cache=True)
        cache = out.cache
        log_probs = torch.log_softmax(out.logits[0].float(), dim=-1)
        bits.append(-log_probs.gather(-1, targets[start:start + chunk_size, None].to(model.device))[:, 0].cpu())
    return torch.cat(bits) / math.log(2)
