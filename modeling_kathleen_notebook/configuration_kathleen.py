"""Configuration of the Kathleen trunk and its notebook memory (SPEC §§2-4)."""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

from transformers import CONFIG_MAPPING, AutoConfig, PreTrainedConfig

# Token ids of the byte vocabulary: three specials, then byte b -> b + BYTE_OFFSET.
PAD_ID, EOS_ID, UNK_ID = 0, 1, 2
BYTE_OFFSET = 3

# The three decay bands of the trunk's leaky integrators (SPEC §2): fast, medium and slow channels.
DEFAULT_DECAY_BANDS = ((0.50, 0.90), (0.90, 0.99), (0.95, 0.9995))

MEMORY_KINDS = ("notebook", "attention", "none")
VALUE_CODEBOOKS = ("shared", "gaussian", "fourier")
KEY_BINDINGS = ("bundle", "bind")
WRITE_SIGNALS = ("gate", "surprise", "gate+surprise")
FFT_NORMS = ("backward", "ortho")
ATTENTION_KEYS = ("current", "previous")


def fast_fft_length(n: int) -> int:
    """The smallest 2^a·3^b ≥ n: a length the FFT handles without slow prime factors."""
    powers = range(n.bit_length() + 1)
    return min(2**a * 3**b for a in powers for b in powers if 2**a * 3**b >= n)


UNBOUND_LOG_NOISE_CAP = 10.0  # log c of a read trust's cap that never binds: c = e^10 nats
SWITCHES = ("read_trust", "forgetting", "learn_forget_rate", "fact_bank", "repeat_read_trust")  # the bool settings

# [KR]'s notebook: what a saved config meant by a setting it does not mention (written before the setting existed),
# and the notebook the needle experiments and the speed benchmarks were measured with
KR_NOTEBOOK = {"key_window": 7, "key_binding": "bundle", "write_signal": "gate", "forgetting": True,
               "forget_logit_init": -2.0, "read_trust": False, "read_noise_cap_init": None}


def with_legacy_settings(config_dict: dict) -> dict:
    """A saved config from before some settings existed: the Fourier value table had period vocab_size, keys were
    bundled over 7 bytes, the gate alone set β, forgetting was on, the read had no trust and a trust's cap started
    unbound, whatever today's defaults are."""
    legacy = {"fourier_period": config_dict.get("vocab_size", 259), **KR_NOTEBOOK}
    return {**legacy, **config_dict}


class KathleenConfig(PreTrainedConfig):
    r"""Configuration of a Kathleen byte language model with an optional second memory.

    Trunk (SPEC §2):
        vocab_size (`int`, 259): pad 0, eos 1, unk 2, byte b -> b + 3.
        d_model (`int`, 96): width D of the residual stream.
        n_layers (`int`, 2): number of trunk blocks.
        decay_bands (`list[list[float]]`, `DEFAULT_DECAY_BANDS`): the (lo, hi) range of γ for each third of
            the channels, assigned by channel index; the remainder of D / 3 goes to the slowest band.
        conv_kernel (`int`, 7): width of the causal depthwise convolution.
        ffn_ratio (`int`, 2): FFN hidden width as a multiple of D.
        dropout (`float`, 0.0): dropout on both residual branches (SPEC §5 uses 0.1 on text).
        initializer_range (`float`, 0.02): std of the normal init of linear and embedding weights.

    Memory (SPEC §3, §4):
        memory (`str`, "notebook"): "notebook", "attention" (one causal softmax head) or "none".
        hrr_dim (`int`, 2048): R, length of the holographic memory vector; must be even.
        key_window (`int`, 16): bytes combined into one context key ([KR]: 7). A fact is recalled when its query
            restates the last key_window bytes before the value as they were read; 16 reaches back past the
            common words a prompt ends in ("called ", " named ") into the name, so facts of one sentence shape
            get different keys (reports/facts.md).
        key_binding (`str`, "bind"): how the key window's bytes combine. "bundle" sums role-bound byte vectors
            ([KR]: contexts sharing k of their bytes have keys of cosine ≈ k/7, so facts in one sentence shape
            leak into each other's reads); "bind" multiplies unit-modulus spectra, one per slot and byte, so every
            distinct window gets a quasi-random unit key (no partial matches, no leaks; SPEC §10). Bound keys
            and the Fourier value table are generated from integers (`notebook.make_codebooks`), so their stored
            tables are [W, F] and [F] whatever R is; "bind" needs value_codebook "fourier".
        write_signal (`str`, "surprise"): what sets the write strength β. "gate": the learned write gate on the
            last `gate_window` bytes; "surprise": sigmoid(a · (S_t - c)) of the trunk's own detached surprise
            S_t = -log p_trunk(x_t | x_<t) in nats, with a learned scale a and shift c; "gate+surprise": both
            logits summed.
        surprise_scale_init (`float`, 1.0): initial a (per nat of surprise).
        surprise_shift_init (`float`, 2.0): initial c in nats (β = 1/2 at 2 nats: a byte the trunk gave less than
            e^-2 ≈ 14%; the shipped notebook's c, chosen on validation facts: reports/facts.md).
        gate_window (`int`, 16): bytes the write gate sees (t-15..t); must cover the needle span.
        gate_embed_dim (`int`, 32): width of the gate's own byte embedding and convolution.
        gate_bias_init (`float`, 2.0): initial bias of the gate's logit (β ≈ 0.88).
        read_scale_init (`float | None`, None): initial read scale s; None picks the value that makes
            s · β · hit ≈ 1 nat under `fft_norm` (a hit scores ≈ 1, or ≈ 1/R with "ortho").
        read_trust (`bool`, True): give the notebook a read trust (read_trust.py): a byte that stands far out of
            the crosstalk gains k · (z - τ) nats, with k set by phrasing-free statistics of the read and of the
            trunk's confidence, and the linear read's crosstalk is held below a cap; fitted by
            scripts/fit_read_trust.py (its initial weights are almost silent). False: the read is linear in the
            memory ([KR]).
        read_noise_cap_init (`float | None`, 0.03): the read trust's initial cap c, in nats, on the crosstalk its
            linear read passes (the shipped checkpoint's fitted cap is 0.028). Training on short sequences never
            fills the memory, so it cannot learn a cap: without one, a notebook trained with its trunk on 512-byte
            windows scored 6.55 bits/byte over the 609 KB test split as one stream, 2.41 with it
            (reports/noise_cap.md). None: e^10 nats, a cap that never binds (what configs written before this
            setting meant).
        read_trust_bias_init (`float`, -4.0): the read trust's initial bias θ₀, its other weights 0: every read starts
            with k = softplus(θ₀) extra nats per unit of z above τ. -4 (k ≈ 0.02) starts it almost silent, for a fit
            that sets it (scripts/fit_read_trust.py). Trained jointly from -1 (k ≈ 0.31, what the shipped
            checkpoint's fit gives a clean hit) the trust stayed loud but the repeat gain did not come back: a
            16-byte key reaches only 14% of repeated words' bytes on text (reports/trust_gain.md).
        fft_norm (`str`, "backward"): FFT convention of the circular convolutions; "backward" is true
            circular convolution, "ortho" divides both binding and unbinding by sqrt(R).
        value_codebook (`str`, "fourier"): the table of stored values; "shared" reuses the key table
            ([KR]), "gaussian" and "fourier" are separate tables (SPEC §8.1). "fourier" is the default:
            the same untrained recall as "gaussian" (SPEC §8.1) and a read that needs no [2F, V] product.
        fourier_period (`int | None`, None): N ≥ vocab_size, the period of the Fourier value table's phases
            exp(2πi k_f b / N); the read is one N-point FFT per position. None picks the smallest 2^a·3^b
            ≥ vocab_size (288 for 259 ids): an FFT of 259 = 7·37 points costs 3.5x one of 288 here
            (scripts/fft_cost.py). Config files written before this setting existed used N = vocab_size,
            and load that way.
        forgetting (`bool`, True): write-triggered forgetting, mem <- (1 - g β) mem + β w.
        forget_logit_init (`float`, -8.5): initial logit of g = forget_max · sigmoid(forget_logit). -8.5 (g ≈ 4e-5)
            is the shipped notebook's: slow enough that a fact outlives 16 KB of text, while the read trust's cap
            keeps the crosstalk of a full memory off ordinary bytes (reports/facts.md); [KR]: -2.
        forget_max (`float`, 0.2): upper bound of the forget rate g.
        learn_forget_rate (`bool`, True): whether training moves the forget logit. False holds g at its initial
            value: a model trained on short sequences never pays for forgetting what lies further back than they
            reach, so a learned g drifts up the longer it trains (reports/l1_nodropout_60min_seed44.md).
        fact_bank (`bool`, False): a second memory of the same R beside the first, the fact bank (issue 18's
            two-bank arm): written with β_f = sigmoid(ℓ_t - d) from the same write logit ℓ_t as β minus a learned
            shift d (so only what is written surely is written there), never forgotten, read with the same keys
            and its own read scale; the two reads are summed before the read trust. The state holds both spectra.
            Decoding runs the PyTorch step, and sessions (unlearning, attribution) and the ONNX export refuse it.
        fact_bank_shift_init (`float`, 4.0): initial d in logits: ordinary text written at β ≈ 0.13 (logit ≈ -1.9)
            reaches the fact bank at β_f ≈ 0.003, a byte written at β ≈ 0.98 at β_f ≈ 0.5.
        repeat_key_window (`int`, 0): with W' > 0, a second memory of the same R beside the first, the repeat bank:
            its keys are bound over the last W' < key_window bytes only (the newest W' slots of the first's key
            frequencies), so a repeat whose 16-byte context differs from the earlier occurrence's still finds it
            (a 16-byte key reaches 0.14 of repeated words' bytes on enwiki, a 4-byte one 0.71: reports/key_reach.md),
            while the first memory's long keys keep facts of one sentence shape apart. Written with the same β and
            forgetting as the first, read with its own read scale; the two reads are summed before the read trust.
            Bound keys only; not with a fact bank. 0: no repeat bank.
        repeat_read_trust (`bool`, False): give the repeat bank a read trust of its own (needs read_trust and a
            repeat bank): each memory's read passes its own trust and cap before the two are added, so the short
            keys' crosstalk is capped apart and a sure hit of either memory speaks for itself (a trust of the sum
            lost long documents' facts: reports/repeat_bank_fitted.md). The model's untrusted `memory_logits` are
            then the two reads side by side, [..., 2V].
        keep_clamp (`float`, 0.75): lower clamp on the keep factor 1 - g β, so 1/Π(keep) stays finite
            inside a scan chunk.
        scan_chunk (`int`, 128): positions per chunk of the notebook's forgetting scan.
        key_seed (`int`, 1234): seed of the fixed codebooks and role vectors (also stored as buffers).
        attention_dim (`int | None`, None): head width of the "attention" arm; None sizes it to the
            trainable parameter count of [KR]'s notebook (with the learned gate: `effective_attention_dim`).
        attention_keys (`str`, "current"): the attention arm's key at position t is made from the trunk's output at
            t ("current", [KR]'s arm) or at t - 1 ("previous": a value is found by the context before it, as the
            notebook binds key_{t-1} with x_t; a one-layer stand-in for a transformer's previous-token head).
        use_cache (`bool`, True): return a `KathleenCache` from forward.
    """

    model_type = "kathleen_notebook"

    def __init__(
        self,
        vocab_size: int = 259,
        d_model: int = 96,
        n_layers: int = 2,
        decay_bands: list[list[float]] | None = None,
        conv_kernel: int = 7,
        ffn_ratio: int = 2,
        dropout: float = 0.0,
        initializer_range: float = 0.02,
        memory: str = "notebook",
        hrr_dim: int = 2048,
        key_window: int = 16,
        key_binding: str = "bind",
        write_signal: str = "surprise",
        surprise_scale_init: float = 1.0,
        surprise_shift_init: float = 2.0,
        gate_window: int = 16,
        gate_embed_dim: int = 32,
        gate_bias_init: float = 2.0,
        read_scale_init: float | None = None,
        read_trust: bool = True,
        read_noise_cap_init: float | None = 0.03,
        read_trust_bias_init: float = -4.0,
        fft_norm: str = "backward",
        value_codebook: str = "fourier",
        fourier_period: int | None = None,
        forgetting: bool = True,
        forget_logit_init: float = -8.5,
        forget_max: float = 0.2,
        learn_forget_rate: bool = True,
        fact_bank: bool = False,
        fact_bank_shift_init: float = 4.0,
        repeat_key_window: int = 0,
        repeat_read_trust: bool = False,
        keep_clamp: float = 0.75,
        scan_chunk: int = 128,
        key_seed: int = 1234,
        attention_dim: int | None = None,
        attention_keys: str = "current",
        use_cache: bool = True,
        **kwargs,
    ):
        self.vocab_size = vocab_size
        self.d_model = d_model
        self.n_layers = n_layers
        self.decay_bands = [list(band) for band in (decay_bands or DEFAULT_DECAY_BANDS)]
        self.conv_kernel = conv_kernel
        self.ffn_ratio = ffn_ratio
        self.dropout = dropout
        self.initializer_range = initializer_range
        self.memory = memory
        self.hrr_dim = hrr_dim
        self.key_window = key_window
        self.key_binding = key_binding
        self.write_signal = write_signal
        self.surprise_scale_init = surprise_scale_init
        self.surprise_shift_init = surprise_shift_init
        self.gate_window = gate_window
        self.gate_embed_dim = gate_embed_dim
        self.gate_bias_init = gate_bias_init
        self.read_scale_init = read_scale_init
        self.read_trust = read_trust
        self.read_noise_cap_init = read_noise_cap_init
        self.read_trust_bias_init = read_trust_bias_init
        self.fft_norm = fft_norm
        self.value_codebook = value_codebook
        self.fourier_period = fast_fft_length(vocab_size) if fourier_period is None else fourier_period
        self.forgetting = forgetting
        self.forget_logit_init = forget_logit_init
        self.forget_max = forget_max
        self.learn_forget_rate = learn_forget_rate
        self.fact_bank = fact_bank
        self.fact_bank_shift_init = fact_bank_shift_init
        self.repeat_key_window = repeat_key_window
        self.repeat_read_trust = repeat_read_trust
        self.keep_clamp = keep_clamp
        self.scan_chunk = scan_chunk
        self.key_seed = key_seed
        self.attention_dim = attention_dim
        self.attention_keys = attention_keys
        self.use_cache = use_cache
        kwargs.setdefault("pad_token_id", PAD_ID)
        kwargs.setdefault("eos_token_id", EOS_ID)
        kwargs.setdefault("bos_token_id", EOS_ID)  # documents are framed by the separator (SPEC §7)
        kwargs.setdefault("tie_word_embeddings", False)
        super().__init__(**kwargs)
        self.validate_kathleen()

    def validate_kathleen(self) -> None:
        """Raise a `ValueError` naming the first setting that cannot build a model."""
        positive = ("vocab_size", "d_model", "n_layers", "conv_kernel", "ffn_ratio", "hrr_dim",
                    "key_window", "gate_window", "gate_embed_dim", "scan_chunk")
        for name in positive:
            value = getattr(self, name)
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"KathleenConfig.{name} must be a positive integer, got {value!r}")
        for name in SWITCHES:  # a string such as "false" would be truthy and silently switch the setting on
            value = getattr(self, name)
            if not isinstance(value, bool):
                raise ValueError(f"KathleenConfig.{name} must be true or false, got {value!r}")
        if self.vocab_size <= UNK_ID:
            raise ValueError(f"KathleenConfig.vocab_size must exceed the special ids, got {self.vocab_size}")
        if self.memory not in MEMORY_KINDS:
            raise ValueError(f"KathleenConfig.memory must be one of {MEMORY_KINDS}, got {self.memory!r}")
        if self.value_codebook not in VALUE_CODEBOOKS:
            raise ValueError(
                f"KathleenConfig.value_codebook must be one of {VALUE_CODEBOOKS}, got {self.value_codebook!r}"
            )
        if not isinstance(self.fourier_period, int) or self.fourier_period < self.vocab_size:
            raise ValueError(f"KathleenConfig.fourier_period must be an integer >= vocab_size ({self.vocab_size}), "
                             f"got {self.fourier_period!r}")
        if self.attention_keys not in ATTENTION_KEYS:
            raise ValueError(f"KathleenConfig.attention_keys must be one of {ATTENTION_KEYS}, got "
                             f"{self.attention_keys!r}")
        if self.key_binding not in KEY_BINDINGS:
            raise ValueError(f"KathleenConfig.key_binding must be one of {KEY_BINDINGS}, got {self.key_binding!r}")
        if self.key_binding == "bind" and self.value_codebook != "fourier":
            raise ValueError(f"KathleenConfig.key_binding='bind' needs value_codebook='fourier', got "
                             f"{self.value_codebook!r}")
        window = self.repeat_key_window
        if isinstance(window, bool) or not isinstance(window, int) or not 0 <= window < self.key_window:
            raise ValueError(f"KathleenConfig.repeat_key_window must be an integer in [0, key_window = "
                             f"{self.key_window}), got {window!r}")
        if window and (self.key_binding != "bind" or self.fact_bank):
            raise ValueError("KathleenConfig.repeat_key_window needs key_binding='bind' and no fact_bank, got "
                             f"key_binding={self.key_binding!r}, fact_bank={self.fact_bank!r}")
        if self.repeat_read_trust and not (window and self.read_trust):
            raise ValueError("KathleenConfig.repeat_read_trust needs a repeat bank (repeat_key_window > 0) and "
                             f"read_trust=True, got repeat_key_window={window!r}, read_trust={self.read_trust!r}")
        if self.write_signal not in WRITE_SIGNALS:
            raise ValueError(f"KathleenConfig.write_signal must be one of {WRITE_SIGNALS}, got {self.write_signal!r}")
        if self.fft_norm not in FFT_NORMS:
            raise ValueError(f"KathleenConfig.fft_norm must be one of {FFT_NORMS}, got {self.fft_norm!r}")
        if self.hrr_dim % 2:
            raise ValueError(f"KathleenConfig.hrr_dim must be even (rfft with a Nyquist bin), got {self.hrr_dim}")
        if len(self.decay_bands) != 3 or any(not 0.0 < lo < hi < 1.0 for lo, hi in self.decay_bands):
            raise ValueError(
                f"KathleenConfig.decay_bands must be three (lo, hi) pairs with 0 < lo < hi < 1, got {self.decay_bands}"
            )
        cap = self.read_noise_cap_init
        if cap is not None and (isinstance(cap, bool) or not isinstance(cap, (int, float)) or not 0.0 < cap < math.inf):
            raise ValueError(f"KathleenConfig.read_noise_cap_init must be a positive number of nats or None, "
                             f"got {cap!r}")
        bias = self.read_trust_bias_init
        if isinstance(bias, bool) or not isinstance(bias, (int, float)) or not math.isfinite(bias):
            raise ValueError(f"KathleenConfig.read_trust_bias_init must be a finite number, got {bias!r}")
        if not 0.0 <= self.dropout < 1.0:
            raise ValueError(f"KathleenConfig.dropout must be in [0, 1), got {self.dropout}")
        if not 0.0 < self.keep_clamp <= 1.0:
            raise ValueError(f"KathleenConfig.keep_clamp must be in (0, 1], got {self.keep_clamp}")
        if not 0.0 <= self.forget_max < 1.0:
            raise ValueError(f"KathleenConfig.forget_max must be in [0, 1), got {self.forget_max}")
        # P = Π keep over a chunk must stay a normal fp32 number (> 1e-37) so that 1/P is finite.
        if self.scan_chunk * -math.log(self.keep_clamp) > 80.0:
            raise ValueError(
                f"KathleenConfig.scan_chunk={self.scan_chunk} with keep_clamp={self.keep_clamp} lets the running "
                "product of keep factors underflow fp32; use a shorter chunk or a larger clamp"
            )

    @classmethod
    def from_dict(cls, config_dict: dict, **kwargs) -> KathleenConfig:
        return super().from_dict(with_legacy_settings(config_dict), **kwargs)

    # ---- derived values, computed in one place -----------------------------------------------

    @property
    def tail_length(self) -> int:
        """Past token ids the notebook keeps between calls: the previous key's window and the gate's."""
        return max(self.key_window, self.gate_window - 1)

    @property
    def uses_gate(self) -> bool:
        """The learned write gate sets (part of) β."""
        return self.write_signal in ("gate", "gate+surprise")

    @property
    def initial_log_noise_cap(self) -> float:
        """log c of a new read trust's cap (read_trust.py); e^10 nats, never binding, for read_noise_cap_init None."""
        return UNBOUND_LOG_NOISE_CAP if self.read_noise_cap_init is None else math.log(self.read_noise_cap_init)

    @property
    def uses_surprise(self) -> bool:
        """The trunk's surprise sets (part of) β, so the notebook needs the trunk's logits."""
        return self.write_signal in ("surprise", "gate+surprise")

    @property
    def effective_read_scale_init(self) -> float:
        """s so that s · β_init · hit ≈ 1 nat (SPEC §3, FFT convention)."""
        if self.read_scale_init is not None:
            return float(self.read_scale_init)
        beta_init = 1.0 / (1.0 + math.exp(-self.gate_bias_init)) if self.write_signal == "gate" else 0.5
        hit = 1.0 if self.fft_norm == "backward" else 1.0 / self.hrr_dim
        return 1.0 / (beta_init * hit)

    @property
    def gate_parameter_count(self) -> int:
        """Parameters of the learned write gate: byte embedding, convolution and output."""
        e = self.gate_embed_dim
        return self.vocab_size * e + (e * e * self.gate_window + e) + (e + 1)

    @property
    def notebook_parameter_count(self) -> int:
        """Trainable parameters of the notebook: the gate (with one), surprise scale and shift (with surprise), read
        scale, forget logit (with forgetting and a learned forget rate; a buffer otherwise), the read trust's θ, τ
        and cap (with one), and the fact bank's shift d and read scale (with one), the repeat bank's read scale (with
        one) and its read trust's 8 numbers (with repeat_read_trust)."""
        gate = self.gate_parameter_count if self.uses_gate else 0
        trust = 8 if self.read_trust else 0  # read_trust.py: six weights, the threshold, the cap
        fact_bank = 2 if self.fact_bank else 0  # its shift d and read scale
        repeat_bank = (1 if self.repeat_key_window else 0) + (8 if self.repeat_read_trust else 0)
        forget_logit = 1 if self.forgetting and self.learn_forget_rate else 0
        return gate + (2 if self.uses_surprise else 0) + 1 + forget_logit + trust + fact_bank + repeat_bank

    @property
    def effective_attention_dim(self) -> int:
        """Width of the attention arm's head: q, k, v (D -> A each) and out (A -> V) match the parameters of [KR]'s
        notebook (learned gate, read scale, forget logit), whatever this config's write rule: a notebook that writes
        on surprise has 3 or 4 parameters, which no attention head matches."""
        if self.attention_dim is not None:
            return int(self.attention_dim)
        per_unit = 3 * self.d_model + self.vocab_size
        return max(1, round((self.gate_parameter_count + 2) / per_unit))


def register_unless_known(config_class: type[PreTrainedConfig]) -> None:
    """Give AutoConfig this config's model type when nothing has yet. Loaded as Hub remote code, this lets a later
    `AutoTokenizer.from_pretrained(repo)` or `AutoConfig.from_pretrained(repo)` without trust_remote_code find the
    type instead of asking whether to run the repository's code (a 15 s prompt at a terminal). The installed
    package registers its own classes unconditionally (`__init__.py`), so they win over a copy loaded remotely."""
    if config_class.model_type not in CONFIG_MAPPING:
        AutoConfig.register(config_class.model_type, config_class)


register_unless_known(KathleenConfig)


@dataclass(frozen=True)
class NotebookSettings:
    """The config fields the notebook uses at run time, as plain attributes (a Transformers config's
    attribute access is slow enough to show up in per-byte decoding)."""

    vocab_size: int
    hrr_dim: int
    key_window: int
    gate_window: int
    fft_norm: str
    value_codebook: str
    fourier_period: int
    key_binding: str
    write_signal: str
    uses_gate: bool
    uses_surprise: bool
    forgetting: bool
    forget_max: float
    fact_bank: bool
    repeat_key_window: int
    repeat_read_trust: bool
    keep_clamp: float
    scan_chunk: int

    @classmethod
    def from_config(cls, config: KathleenConfig) -> NotebookSettings:
        return cls(**{f.name: getattr(config, f.name) for f in dataclasses.fields(cls)})
