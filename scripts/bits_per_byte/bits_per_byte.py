"""An `evaluate` metric: exact bits/byte and byte perplexity of texts under a Kathleen model.

    import evaluate
    metric = evaluate.load("scripts/bits_per_byte")          # a local path: works offline
    metric.compute(predictions=["some text", ...], model_id="path/or/hub-id")

Each text is scored as one stream with the separator (eos) before it (`window=None`), or in
independent windows of `window` bytes as lm-evaluation-harness does. Totals are weighted by bytes.
"""

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

        import modeling_kathleen_notebook  # noqa: F401  registers the Auto classes
        from modeling_kathleen_notebook.scoring import byte_bits
        from modeling_kathleen_notebook.tokenization_kathleen import bytes_to_ids

        model = AutoModelForCausalLM.from_pretrained(model_id) if isinstance(model_id, str) else model_id
        model.eval()
        per_text, total_bits, total_bytes = [], 0.0, 0
        with torch.no_grad():
            for text in predictions:
                bits = byte_bits(model, bytes_to_ids(text.encode("utf-8")), window, chunk_size)
                per_text.append(bits.mean().item())
                total_bits, total_bytes = total_bits + bits.sum().item(), total_bytes + bits.numel()
        bpb = total_bits / total_bytes
        return {"bits_per_byte": bpb, "byte_perplexity": 2.0 ** bpb, "bits_per_byte_per_text": per_text}
