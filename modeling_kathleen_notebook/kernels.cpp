// The notebook's compiled CPU kernels: see kernels.py, which builds this file, for what each computes.
#include <torch/extension.h>
#include <ATen/Parallel.h>
#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

namespace {

// the kernels index tables with these numbers: refuse any outside [0, size) instead of reading past a table
void check_range(const torch::Tensor& indices, int64_t size, const char* what) {
  if (indices.numel() == 0) return;
  const auto [low, high] = torch::aminmax(indices);
  TORCH_CHECK(low.item<int64_t>() >= 0 && high.item<int64_t>() < size, what, " outside [0, ", size, ")");
}

constexpr int64_t KEY_TURNS = 65536;  // Q: bound keys are Q-th roots of unity
constexpr int64_t KEY_BLOCK = 2048;   // frequencies per block of bound turns: they stay in L1 over the W slots

// A bound key (1), exp(2πi (Σ_j k_{j,f} x_{t-j} mod Q) / Q), into out [2F] (re, im) from the window's ids w[0..W-1]
// (oldest first), k [W, F] int16 residues mod Q in the windows' order and the Q = 2^16 roots of unity. Unsigned
// 16-bit arithmetic wraps mod 2^16, so the turns are exact and the [W, F] table is read at 2 bytes per entry; the
// pad id (0) adds nothing. `turns` is KEY_BLOCK of scratch.
void bound_key(const uint16_t* __restrict__ k, const float* __restrict__ roots, const int64_t* w, int64_t W, int64_t F,
               float* __restrict__ out, uint16_t* __restrict__ turns) {
  for (int64_t start = 0; start < F; start += KEY_BLOCK) {
    const int64_t n = std::min(KEY_BLOCK, F - start);
    std::fill(turns, turns + n, uint16_t{0});
    for (int64_t i = 0; i < W; ++i) {  // vectorised over the block's frequencies
      const uint16_t* __restrict__ row = k + i * F + start;
      const uint16_t id = static_cast<uint16_t>(w[i]);
      #pragma omp simd
      for (int64_t f = 0; f < n; ++f) turns[f] = static_cast<uint16_t>(turns[f] + row[f] * id);
    }
    for (int64_t f = 0; f < n; ++f) {
      const float* root = roots + 2 * turns[f];
      out[2 * (start + f)] = root[0];
      out[2 * (start + f) + 1] = root[1];
    }
  }
}

// out[j] = (out[j] unless Fresh) + Σ_{i<N} rows[i][j] for j < n, in one pass over out; returns Σ_j out[j]². N is a
// compile-time number so that the sum over the rows unrolls inside the vectorised loop (a loop over a runtime
// count of rows there, or a pass over out per row, ran at half the speed or less).
template <int N, bool Fresh>
float add_rows(const float* const* rows, float* __restrict__ out, int64_t n) {
  const float* __restrict__ r[N];
  std::copy(rows, rows + N, r);
  float sum = 0.0f;
  #pragma omp simd reduction(+ : sum)
  for (int64_t j = 0; j < n; ++j) {
    float v = Fresh ? 0.0f : out[j];
    for (int i = 0; i < N; ++i) v += r[i][j];
    out[j] = v;
    sum += v * v;
  }
  return sum;
}

// A bundled key (1), Σ_i role_terms[offsets[i] + w[i]], into out [2F] (re, im) from the window's ids w[0..W-1]
// (oldest first) and the role table [W·V, 2F] (zero rows for the pad id), eight rows a pass over out. Returns its
// scale 1/‖k‖ (0 for a window of padding), by Parseval: R ‖k‖² = Σ_f m_f |K_f|², m = 2 but 1 at DC and Nyquist
// (real there).
float bundled_key(const float* terms, const int64_t* offsets, const int64_t* w, int64_t W, int64_t F, float* out) {
  using Add = float (*)(const float* const*, float*, int64_t);
  static constexpr Add first_pass[] = {add_rows<1, true>, add_rows<2, true>, add_rows<3, true>, add_rows<4, true>,
                                       add_rows<5, true>, add_rows<6, true>, add_rows<7, true>, add_rows<8, true>};
  static constexpr Add later_pass[] = {add_rows<1, false>, add_rows<2, false>, add_rows<3, false>,
                                       add_rows<4, false>, add_rows<5, false>, add_rows<6, false>,
                                       add_rows<7, false>, add_rows<8, false>};
  std::fill(out, out + (W == 0 ? 2 * F : 0), 0.0f);
  float sum = 0.0f;
  for (int64_t i = 0; i < W; i += 8) {
    const int64_t n = std::min<int64_t>(8, W - i);
    std::array<const float*, 8> rows;
    for (int64_t r = 0; r < n; ++r) rows[r] = terms + 2 * F * (offsets[i + r] + w[i + r]);
    sum = (i == 0 ? first_pass : later_pass)[n - 1](rows.data(), out, 2 * F);
  }
  sum = 2.0f * sum - out[0] * out[0] - out[2 * F - 2] * out[2 * F - 2];
  return sum > 0.0f ? std::sqrt(2.0f * (F - 1) / sum) : 0.0f;
}

// The rows a chunk reads, as float pointers (re, im interleaved): CV[x_t], and the keys K_{t-1}, K_t. values [V, F],
// ids [B, C], and either keys [B, C+1, F] (strided views of the whole sequence's tensors are fine) or, for bound
// keys formed here instead of read from memory, key_ids [B, C+W] (key j is that of the window key_ids[:, j:j+W]),
// residues [W, F] int16 and the Q roots of unity [Q] complex64 (keys then empty).
struct ChunkRows {
  const torch::Tensor& values;
  const torch::Tensor& ids;
  const torch::Tensor& keys;
  torch::Tensor key_ids;
  const uint16_t* residues = nullptr;
  const float* roots = nullptr;
  int64_t F, W = 0, key_b = 0, key_t = 0, id_b, id_t;

  ChunkRows(const torch::Tensor& values_, const torch::Tensor& ids_, const torch::Tensor& keys_,
            const torch::Tensor& key_ids_, const torch::Tensor& residues_, const torch::Tensor& roots_)
      : values(values_), ids(ids_), keys(keys_), F(values_.size(1)), id_b(ids_.stride(0)), id_t(ids_.stride(1)) {
    TORCH_CHECK(values.device().is_cpu() && values.scalar_type() == torch::kComplexFloat && values.is_contiguous() &&
                !values.is_conj(), "contiguous complex64 CPU values");
    TORCH_CHECK(ids.scalar_type() == torch::kLong, "int64 ids");
    check_range(ids, values.size(0), "value ids");
    if (keys.numel()) {
      TORCH_CHECK(keys.device().is_cpu() && keys.scalar_type() == torch::kComplexFloat && keys.stride(2) == 1 &&
                  !keys.is_conj(), "complex64 CPU key spectra, contiguous and without a lazy conjugation");
      TORCH_CHECK(keys.size(1) == ids.size(1) + 1 && keys.size(2) == F, "keys [B, C+1, F]");
      key_b = 2 * keys.stride(0);
      key_t = 2 * keys.stride(1);
      return;
    }
    W = residues_.size(0);
    TORCH_CHECK(residues_.scalar_type() == torch::kShort && residues_.is_contiguous() && residues_.size(1) == F,
                "key residues [W, F] int16");
    TORCH_CHECK(roots_.scalar_type() == torch::kComplexFloat && roots_.is_contiguous() && roots_.numel() == KEY_TURNS,
                "roots of unity [Q] complex64");
    TORCH_CHECK(key_ids_.scalar_type() == torch::kLong && key_ids_.size(0) == ids.size(0) &&
                key_ids_.size(1) == ids.size(1) + W, "key ids [B, C+W] int64");
    key_ids = key_ids_.contiguous();
    residues = reinterpret_cast<const uint16_t*>(residues_.data_ptr<int16_t>());
    roots = reinterpret_cast<const float*>(roots_.data_ptr());
  }
  const float* value(int64_t b, int64_t t) const {
    return reinterpret_cast<const float*>(values.data_ptr()) + 2 * F * ids.data_ptr<int64_t>()[b * id_b + t * id_t];
  }
  // keys[b, t], which is K_{t-1}: a row of the given keys, or the bound key formed into `buffer` [2F]
  const float* key(int64_t b, int64_t t, float* buffer, uint16_t* turns) const {
    if (residues == nullptr) return reinterpret_cast<const float*>(keys.data_ptr()) + b * key_b + t * key_t;
    bound_key(residues, roots, key_ids.data_ptr<int64_t>() + b * key_ids.size(1) + t, W, F, buffer, turns);
    return buffer;
  }
};

// 2 k_f: where frequency f lands in a row of interleaved bins (re, im, re, im, ...)
std::vector<int32_t> bin_offsets(const torch::Tensor& frequencies, int64_t period) {
  check_range(frequencies, period, "frequencies");
  auto f = frequencies.contiguous();
  std::vector<int32_t> offsets(f.numel());
  for (int64_t i = 0; i < f.numel(); ++i) offsets[i] = static_cast<int32_t>(2 * f.data_ptr<int64_t>()[i]);
  return offsets;
}

// The Hermitian half of a position's bins, H'_j for j = 0 .. N/2 (N/2 + 1 of them, as an rfft's): with
// H'_j = (conj(H_j) + H_{N-j}) / 2 the read gain · Re FFT_N(H)_b is gain · irfft(H', N)_b without the 1/N, a real
// inverse FFT of half the work, on half the memory. Frequency f, in bin k_f with weight c_f (1/2 at DC and Nyquist,
// 1 elsewhere), adds to H'_{j_f}, j_f = min(k_f, N - k_f): c_f conj(z)/2 where k_f < N - k_f, c_f z/2 where
// k_f > N - k_f, c_f Re z where the bin is its own mirror (0, and N/2 for even N: irfft ignores their imaginary
// parts). The backward picks the adjoint of bin k_f, Σ_b g_b e^{+2πi k_f b/N}, from R = rfft(g, N): conj(R_{j_f})
// where k_f <= N - k_f, else R_{j_f}, times c_f.
struct HalfBins {
  std::vector<int32_t> offset;           // 2 j_f: where frequency f lands in a row of interleaved half bins
  std::vector<float> write_re, write_im;  // the forward's weights of Re z and Im z
  std::vector<float> pick_re, pick_im;    // the backward's weights of Re R_{j_f} and Im R_{j_f}
};

HalfBins half_bins(const torch::Tensor& frequencies, int64_t period) {
  check_range(frequencies, period, "frequencies");
  const auto f = frequencies.contiguous();
  const int64_t F = f.numel();
  HalfBins h{std::vector<int32_t>(F), std::vector<float>(F), std::vector<float>(F), std::vector<float>(F),
             std::vector<float>(F)};
  for (int64_t i = 0; i < F; ++i) {
    const int64_t k = f.data_ptr<int64_t>()[i], mirror = (period - k) % period;
    const float c = (i == 0 || i == F - 1) ? 0.5f : 1.0f;
    h.offset[i] = static_cast<int32_t>(2 * std::min(k, mirror));
    h.write_re[i] = k == mirror ? c : 0.5f * c;
    h.write_im[i] = k == mirror ? 0.0f : (k < mirror ? -0.5f * c : 0.5f * c);
    h.pick_re[i] = c;
    h.pick_im[i] = k <= mirror ? -c : c;
  }
  return h;
}

}  // namespace

// The bundled keys (1) of a run of windows and their scales, what `NotebookTables.bind` forms with an embedding-bag
// sum and a norm in PyTorch (two passes over the [B, n+1, F] keys) in one pass: role_terms [W·V, 2F] float (zero rows
// for the pad id), row_offsets [W] (window slot -> first row), ids [B, n+W] (key j is that of the window
// ids[:, j:j+W], the newest byte last) -> keys [B, n+1, F] complex64, scales [B, n+1] (1/‖k‖, 0 for padding)
std::vector<torch::Tensor> bundled_keys(torch::Tensor role_terms, torch::Tensor row_offsets, torch::Tensor ids) {
  TORCH_CHECK(role_terms.device().is_cpu() && role_terms.scalar_type() == torch::kFloat && role_terms.dim() == 2 &&
              role_terms.size(1) % 2 == 0, "role terms [W·V, 2F] float on the CPU");
  const int64_t W = row_offsets.numel(), F = role_terms.size(1) / 2, B = ids.size(0), n = ids.size(1) - W;
  TORCH_CHECK(ids.scalar_type() == torch::kLong && ids.dim() == 2 && n >= 0, "ids [B, n+W] int64");
  TORCH_CHECK(row_offsets.scalar_type() == torch::kLong, "int64 row offsets");
  check_range(ids, role_terms.size(0) / std::max<int64_t>(W, 1), "key ids");
  check_range(row_offsets, role_terms.size(0) - role_terms.size(0) / std::max<int64_t>(W, 1) + 1, "row offsets");
  const auto terms = role_terms.contiguous();
  const auto window = ids.contiguous();
  const auto offsets = row_offsets.contiguous();
  auto keys = torch::empty({B, n + 1, F}, role_terms.options().dtype(torch::kComplexFloat));
  auto scales = torch::empty({B, n + 1}, role_terms.options());
  at::parallel_for(0, B * (n + 1), 64, [&](int64_t first, int64_t last) {
    for (int64_t p = first; p < last; ++p) {
      const int64_t b = p / (n + 1), j = p % (n + 1);
      scales.data_ptr<float>()[p] = bundled_key(terms.data_ptr<float>(), offsets.data_ptr<int64_t>(),
                                                window.data_ptr<int64_t>() + b * (n + W) + j, W, F,
                                                reinterpret_cast<float*>(keys.data_ptr()) + 2 * F * p);
    }
  });
  return {keys, scales};
}

// values [V, F], ids [B, C], keys [B, C+1, F] (keys[:, t] is K_{t-1}) or empty with key_ids, residues and roots
// (ChunkRows), coeff [B, C] float, start [B, F] or empty, frequencies [F] -> the half bins [B, C, N/2 + 1]
// (complex64, `half_bins`), the state after the chunk [B, F]. The bins are gathered READ_TILE positions at a time:
// each frequency adds to the same bin of every position of the tile, one short vector instead of READ_TILE scalar
// read-modify-writes at random places of their rows (which were the slower half of the loop).
std::vector<torch::Tensor> scan_read_bins(torch::Tensor values, torch::Tensor ids, torch::Tensor keys,
                                          torch::Tensor key_ids, torch::Tensor residues, torch::Tensor roots,
                                          torch::Tensor coeff, torch::Tensor start, torch::Tensor frequencies,
                                          int64_t period) {
  constexpr int64_t READ_TILE = 8;
  const ChunkRows rows(values, ids, keys, key_ids, residues, roots);
  const int64_t B = ids.size(0), C = ids.size(1), F = values.size(1);
  auto coeffs = coeff.to(torch::kFloat).contiguous();
  auto starts = start.numel() ? start.resolve_conj().contiguous() : start;
  const int64_t H = period / 2 + 1;
  auto bins = torch::empty({B, C, H}, values.options());
  auto end = torch::empty({B, F}, values.options());
  TORCH_CHECK(coeffs.numel() == B * C && (!starts.numel() || starts.numel() == B * F), "coeff [B, C], start [B, F]");
  const auto half = half_bins(frequencies, period);
  at::parallel_for(0, B, 1, [&](int64_t first, int64_t last) {
    // unbound: S ⊙ conj(K_t) of the tile's positions [READ_TILE, 2F]; tile_bins: their half bins, bin-major
    // [H, re/im, READ_TILE]
    std::vector<float> state(2 * F), unbound(READ_TILE * 2 * F), tile_bins(2 * H * READ_TILE), formed(4 * F);
    std::vector<uint16_t> turns(KEY_BLOCK);
    for (int64_t b = first; b < last; ++b) {
      float* __restrict__ s = state.data();
      const float* k_next = rows.key(b, 0, formed.data(), turns.data());
      if (starts.numel()) {
        const float* s0 = reinterpret_cast<const float*>(starts.data_ptr()) + 2 * F * b;
        std::copy(s0, s0 + 2 * F, s);
      } else {
        std::fill(state.begin(), state.end(), 0.0f);
      }
      for (int64_t t0 = 0; t0 < C; t0 += READ_TILE) {
        const int64_t n = std::min(READ_TILE, C - t0);
        for (int64_t l = 0; l < n; ++l) {
          const int64_t t = t0 + l;
          float* __restrict__ z = unbound.data() + 2 * F * l;
          const float* __restrict__ v = rows.value(b, t);
          const float* __restrict__ k = k_next;  // K_{t-1}
          const float* __restrict__ q = rows.key(b, t + 1, formed.data() + 2 * F * ((t + 1) % 2), turns.data());
          k_next = q;  // K_t
          const float c = coeffs.data_ptr<float>()[b * C + t];
          #pragma omp simd
          for (int64_t f = 0; f < F; ++f) {
            const float vr = v[2 * f], vi = v[2 * f + 1], kr = k[2 * f], ki = k[2 * f + 1];
            const float sr = s[2 * f] + c * (vr * kr - vi * ki), si = s[2 * f + 1] + c * (vr * ki + vi * kr);
            s[2 * f] = sr;
            s[2 * f + 1] = si;
            z[2 * f] = sr * q[2 * f] + si * q[2 * f + 1];  // S ⊙ conj(K_t)
            z[2 * f + 1] = si * q[2 * f] - sr * q[2 * f + 1];
          }
        }
        float* __restrict__ h = tile_bins.data();
        const float* __restrict__ z = unbound.data();
        std::fill(tile_bins.begin(), tile_bins.end(), 0.0f);
        for (int64_t f = 0; f < F; ++f) {  // columns past n hold an earlier tile's numbers: never copied out
          float* __restrict__ bin = h + half.offset[f] * READ_TILE;  // re at 2 j_f, im at 2 j_f + 1, per position
          const float wr = half.write_re[f], wi = half.write_im[f];
          #pragma omp simd
          for (int64_t l = 0; l < READ_TILE; ++l) {
            bin[l] += wr * z[2 * F * l + 2 * f];
            bin[READ_TILE + l] += wi * z[2 * F * l + 2 * f + 1];
          }
        }
        float* out = reinterpret_cast<float*>(bins.data_ptr()) + 2 * H * (b * C + t0);
        for (int64_t l = 0; l < n; ++l)
          for (int64_t j = 0; j < 2 * H; ++j) out[2 * H * l + j] = h[j * READ_TILE + l];
      }
      std::copy(s, s + 2 * F, reinterpret_cast<float*>(end.data_ptr()) + 2 * F * b);
    }
  });
  return {bins, end};
}

// grad_bins [B, C, N/2 + 1]: rfft_N of the gradient of each position's read (`half_bins`); grad_end [B, F]
// -> the gradient of coeff [B, C] and of start [B, F]
std::vector<torch::Tensor> scan_read_bins_backward(torch::Tensor values, torch::Tensor ids, torch::Tensor keys,
                                                   torch::Tensor key_ids, torch::Tensor residues, torch::Tensor roots,
                                                   torch::Tensor grad_bins, torch::Tensor grad_end,
                                                   torch::Tensor frequencies, int64_t period) {
  const ChunkRows rows(values, ids, keys, key_ids, residues, roots);
  const int64_t B = ids.size(0), C = ids.size(1), F = values.size(1), H = period / 2 + 1;
  // an FFT may hand back a lazily conjugated tensor: its memory holds the unconjugated numbers
  auto adjoint = grad_bins.to(torch::kComplexFloat).resolve_conj().contiguous();
  auto ends = grad_end.to(torch::kComplexFloat).resolve_conj().contiguous();
  TORCH_CHECK(adjoint.size(0) == B && adjoint.size(1) == C && adjoint.size(2) == H && ends.numel() == B * F,
              "grad_bins [B, C, N/2 + 1], grad_end [B, F]");
  auto grad_coeff = torch::empty({B, C}, values.options().dtype(torch::kFloat));
  auto grad_start = torch::empty({B, F}, values.options());
  const auto half = half_bins(frequencies, period);
  at::parallel_for(0, B, 1, [&](int64_t first, int64_t last) {
    std::vector<float> suffix_sum(2 * F), formed(4 * F);
    std::vector<uint16_t> turns(KEY_BLOCK);
    for (int64_t b = first; b < last; ++b) {
      float* __restrict__ s = suffix_sum.data();  // Σ of the state gradients from t on, and the end's
      const float* k_later = rows.key(b, C, formed.data() + 2 * F * (C % 2), turns.data());  // K_{C-1}
      const float* e = reinterpret_cast<const float*>(ends.data_ptr()) + 2 * F * b;
      std::copy(e, e + 2 * F, s);
      for (int64_t t = C - 1; t >= 0; --t) {
        // the adjoint of each frequency's bin, picked inside the loop below (a loop of its own first, storing the
        // picks, was slower)
        const float* __restrict__ a = reinterpret_cast<const float*>(adjoint.data_ptr()) + 2 * H * (b * C + t);
        const float* __restrict__ v = rows.value(b, t);
        const float* __restrict__ k = rows.key(b, t, formed.data() + 2 * F * (t % 2), turns.data());  // K_{t-1}
        const float* __restrict__ q = k_later;  // K_t
        k_later = k;
        float dot = 0.0f;
        #pragma omp simd reduction(+ : dot)
        for (int64_t f = 0; f < F; ++f) {
          const float qr = q[2 * f], qi = q[2 * f + 1];
          const float gr = half.pick_re[f] * a[half.offset[f]], gi = half.pick_im[f] * a[half.offset[f] + 1];
          const float sr = s[2 * f] + (gr * qr - gi * qi);  // + adjoint ⊙ K_t
          const float si = s[2 * f + 1] + (gr * qi + gi * qr);
          s[2 * f] = sr;
          s[2 * f + 1] = si;
          const float vr = v[2 * f], vi = v[2 * f + 1], kr = k[2 * f], ki = k[2 * f + 1];
          dot += sr * (vr * kr - vi * ki) + si * (vr * ki + vi * kr);  // Re⟨suffix, CV[x_t] ⊙ K_{t-1}⟩
        }
        grad_coeff.data_ptr<float>()[b * C + t] = dot;
      }
      std::copy(s, s + 2 * F, reinterpret_cast<float*>(grad_start.data_ptr()) + 2 * F * b);
    }
  });
  return {grad_coeff, grad_start};
}

// One decoded byte per sequence (no autograd): the keys (1) of positions t-1 and t from the last W+1 ids,
// their scales σ = 1/‖k‖, the write (3) and the bins of the read (4)-(5). role_terms [W·V, 2F] float (zero
// rows for the pad id), row_offsets [W] (window slot -> first row), ids [B, W+1] (oldest first, x_t last),
// values [V, F], memory [B, F], beta [B], keep [B] or empty -> bins [B, N], new memory [B, F], σ_t [B]
std::vector<torch::Tensor> notebook_step(torch::Tensor role_terms, torch::Tensor row_offsets, torch::Tensor ids,
                                         torch::Tensor values, torch::Tensor memory, torch::Tensor beta,
                                         torch::Tensor keep, torch::Tensor frequencies, int64_t period) {
  TORCH_CHECK(role_terms.scalar_type() == torch::kFloat && role_terms.is_contiguous(), "float role table");
  TORCH_CHECK(values.scalar_type() == torch::kComplexFloat && memory.scalar_type() == torch::kComplexFloat,
              "complex64 values and memory");
  const int64_t B = ids.size(0), W = row_offsets.numel(), F = values.size(1);
  TORCH_CHECK(ids.size(1) == W + 1 && role_terms.size(1) == 2 * F, "ids [B, W+1], role terms [W·V, 2F]");
  TORCH_CHECK(memory.size(0) == B && memory.size(1) == F && beta.numel() == B && (!keep.numel() || keep.numel() == B),
              "memory [B, F], beta and keep [B]");
  check_range(ids, values.size(0), "value ids");
  check_range(row_offsets, role_terms.size(0) - values.size(0) + 1, "row offsets");
  auto window = ids.contiguous();
  auto offsets_of_rows = row_offsets.contiguous();
  auto memories = memory.resolve_conj().contiguous();
  auto betas = beta.to(torch::kFloat).contiguous();
  auto keeps = keep.numel() ? keep.to(torch::kFloat).contiguous() : keep;
  auto bins = torch::zeros({B, period}, values.options());
  auto updated = torch::empty({B, F}, values.options());
  auto read_scales = torch::empty({B}, betas.options());
  const auto offsets = bin_offsets(frequencies, period);
  const float* terms = role_terms.data_ptr<float>();
  std::vector<float> previous(2 * F), current(2 * F);
  for (int64_t b = 0; b < B; ++b) {
    const int64_t* id = window.data_ptr<int64_t>() + b * (W + 1);
    float* __restrict__ kp = previous.data();
    float* __restrict__ kn = current.data();
    const float scale_p = bundled_key(terms, offsets_of_rows.data_ptr<int64_t>(), id, W, F, kp);  // K_{t-1}
    const float scale_n = bundled_key(terms, offsets_of_rows.data_ptr<int64_t>(), id + 1, W, F, kn);  // K_t
    const float c = betas.data_ptr<float>()[b] * scale_p, a = keeps.numel() ? keeps.data_ptr<float>()[b] : 1.0f;
    const float* __restrict__ v = reinterpret_cast<const float*>(values.data_ptr()) + 2 * F * id[W];
    const float* __restrict__ m = reinterpret_cast<const float*>(memories.data_ptr()) + 2 * F * b;
    float* __restrict__ s = reinterpret_cast<float*>(updated.data_ptr()) + 2 * F * b;
    float* h = reinterpret_cast<float*>(bins.data_ptr()) + 2 * period * b;
    for (int64_t f = 0; f < F; ++f) {
      const float vr = v[2 * f], vi = v[2 * f + 1], kr = kp[2 * f], ki = kp[2 * f + 1];
      const float sr = a * m[2 * f] + c * (vr * kr - vi * ki), si = a * m[2 * f + 1] + c * (vr * ki + vi * kr);
      s[2 * f] = sr;
      s[2 * f + 1] = si;
      const float half = (f == 0 || f == F - 1) ? 0.5f : 1.0f;  // DC and Nyquist
      h[offsets[f]] += half * (sr * kn[2 * f] + si * kn[2 * f + 1]);  // M ⊙ conj(K_t)
      h[offsets[f] + 1] += half * (si * kn[2 * f] - sr * kn[2 * f + 1]);
    }
    read_scales.data_ptr<float>()[b] = scale_n;
  }
  return {bins, updated, read_scales};
}

// ---- a whole decoded byte of KathleenForCausalLM (decode_step.py says which tensors come in which order) -------

namespace {

const float* floats(const torch::Tensor& t) { return t.data_ptr<float>(); }

// check_range without ATen calls (each costs microseconds, a decoded byte tens of them): contiguous int64 only
bool in_range(const torch::Tensor& indices, int64_t size) {
  const int64_t* p = indices.data_ptr<int64_t>();
  return std::all_of(p, p + indices.numel(), [size](int64_t i) { return i >= 0 && i < size; });
}

void check_ids(const torch::Tensor& indices, int64_t size, const char* what) {
  TORCH_CHECK(indices.scalar_type() == torch::kLong && indices.is_contiguous(), what, ": contiguous int64");
  TORCH_CHECK(in_range(indices, size), what, " outside [0, ", size, ")");
}

// y[o] = b[o] + Σ_i W[o, i] x[i] for W [O, I] row-major (b may be null), four outputs at a time: four independent
// sums over one pass of x (one sum at a time waits on each multiply-add before the next), in 8-lane vectors, whose
// sums end in fewer scalar additions than 16-lane ones
void matvec(const float* __restrict__ W, const float* __restrict__ b, const float* __restrict__ x, float* __restrict__ y,
            int64_t O, int64_t I) {
  int64_t o = 0;
  for (; o + 4 <= O; o += 4) {
    const float *__restrict__ r0 = W + o * I, *__restrict__ r1 = r0 + I, *__restrict__ r2 = r1 + I,
                *__restrict__ r3 = r2 + I;
    float s0 = 0.0f, s1 = 0.0f, s2 = 0.0f, s3 = 0.0f;
    #pragma omp simd simdlen(8) reduction(+ : s0, s1, s2, s3)
    for (int64_t i = 0; i < I; ++i) {
      s0 += r0[i] * x[i];
      s1 += r1[i] * x[i];
      s2 += r2[i] * x[i];
      s3 += r3[i] * x[i];
    }
    const float sums[4] = {s0, s1, s2, s3};
    for (int64_t k = 0; k < 4; ++k) y[o + k] = b ? sums[k] + b[o + k] : sums[k];
  }
  for (; o < O; ++o) {
    const float* __restrict__ row = W + o * I;
    float sum = 0.0f;
    #pragma omp simd simdlen(8) reduction(+ : sum)
    for (int64_t i = 0; i < I; ++i) sum += row[i] * x[i];
    y[o] = b ? sum + b[o] : sum;
  }
}

// Y [B, O] = X [B, I] W^T + b, row-major (b may be null): a matrix-vector product per row for a few rows, else one
// matrix product (ATen's, blocked for the cache), where each weight is read once for all rows instead of once per row
constexpr int64_t MATMUL_ROWS = 4;

void linear_rows(const float* W, const float* b, const float* X, float* Y, int64_t B, int64_t O, int64_t I) {
  if (B < MATMUL_ROWS) {
    for (int64_t r = 0; r < B; ++r) matvec(W, b, X + r * I, Y + r * O, O, I);
    return;
  }
  const auto fp32 = torch::TensorOptions().dtype(torch::kFloat);
  auto x = torch::from_blob(const_cast<float*>(X), {B, I}, fp32);
  auto w = torch::from_blob(const_cast<float*>(W), {O, I}, fp32);
  auto y = torch::from_blob(Y, {B, O}, fp32);
  if (b) {
    at::addmm_out(y, torch::from_blob(const_cast<float*>(b), {O}, fp32), x, w.t());
  } else {
    at::mm_out(y, x, w.t());
  }
}

void layer_norm(const float* __restrict__ x, const float* __restrict__ w, const float* __restrict__ b,
                float* __restrict__ y, int64_t D, float eps) {
  float mean = 0.0f, var = 0.0f;
  for (int64_t i = 0; i < D; ++i) mean += x[i];
  mean /= D;
  for (int64_t i = 0; i < D; ++i) var += (x[i] - mean) * (x[i] - mean);
  const float inv = 1.0f / std::sqrt(var / D + eps);
  for (int64_t i = 0; i < D; ++i) y[i] = (x[i] - mean) * inv * w[i] + b[i];
}

inline float sigmoid(float x) { return 1.0f / (1.0f + std::exp(-x)); }
inline float gelu(float x) { return 0.5f * x * (1.0f + std::erf(x * static_cast<float>(M_SQRT1_2))); }

bool all_floats(const std::vector<torch::Tensor>& tensors) {
  return std::all_of(tensors.begin(), tensors.end(), [](const torch::Tensor& t) {
    return t.device().is_cpu() && t.scalar_type() == torch::kFloat && t.is_contiguous();
  });
}

// The trunk's weights, as decode_step.py lists them: embed [V, D], final norm weight and bias, head [V, D], the
// bands' lo and width [D], then per block 18 tensors (BLOCK_TENSORS).
constexpr size_t TRUNK_HEAD = 6, BLOCK_TENSORS = 18;

struct Block {
  const float *norm_w, *norm_b, *value_w, *value_b, *decay_w, *decay_b, *mix_w, *mix_b, *conv_w, *conv_b, *out_w,
      *out_b, *ffn_norm_w, *ffn_norm_b, *ffn_in_w, *ffn_in_b, *ffn_out_w, *ffn_out_b;
  explicit Block(const torch::Tensor* t)
      : norm_w(floats(t[0])), norm_b(floats(t[1])), value_w(floats(t[2])), value_b(floats(t[3])),
        decay_w(floats(t[4])), decay_b(floats(t[5])), mix_w(floats(t[6])), mix_b(floats(t[7])),
        conv_w(floats(t[8])), conv_b(floats(t[9])), out_w(floats(t[10])), out_b(floats(t[11])),
        ffn_norm_w(floats(t[12])), ffn_norm_b(floats(t[13])), ffn_in_w(floats(t[14])), ffn_in_b(floats(t[15])),
        ffn_out_w(floats(t[16])), ffn_out_b(floats(t[17])) {}
};

// The notebook's tensors, as decode_step.py lists them (empty tensors for parts a config does not have). A repeat
// bank (numbers[9] = its window W' > 0) has its read scale, its own read trust (with repeat_read_trust), its bound
// keys' residues [W', F] and its spectrum. Each memory's key memo (KeyMemo) comes last.
enum NotebookTensor {
  SPECTRUM, TAIL, LAST_LOGITS, KEY_TABLE, ROW_OFFSETS, ROOTS, WRITE_VALUES, FREQUENCIES, READ_SCALE, FORGET_LOGIT,
  SURPRISE_SCALE, SURPRISE_SHIFT, GATE_EMBED, GATE_CONV_W, GATE_CONV_B, GATE_OUT_W, GATE_OUT_B, TRUST_WEIGHTS,
  TRUST_THRESHOLD, TRUST_LOG_NOISE_CAP, REPEAT_READ_SCALE, REPEAT_TRUST_WEIGHTS, REPEAT_TRUST_THRESHOLD,
  REPEAT_TRUST_LOG_NOISE_CAP, REPEAT_KEY_TABLE, REPEAT_SPECTRUM, KEY_MEMO_IDS, KEY_MEMO, REPEAT_KEY_MEMO_IDS,
  REPEAT_KEY_MEMO, NOTEBOOK_TENSORS
};

// The key of the window w[0..W-1] (oldest first), unnormalised, into out [2F]: bundled, a sum of W role rows
// [W·V, 2F]; bound, `bound_key` from k [W, F] int16 residues mod Q and the Q roots of unity. `key_table` is
// nb[KEY_TABLE], or a repeat bank's residues. `turns` is KEY_BLOCK of scratch. Returns its scale 1/‖k‖ (0 for a window
// of padding).
float window_key(const torch::Tensor& key_table, const std::vector<torch::Tensor>& nb, const int64_t* w, int64_t W,
                 int64_t F, float* __restrict__ out, uint16_t* __restrict__ turns) {
  if (nb[ROOTS].numel()) {
    bound_key(reinterpret_cast<const uint16_t*>(key_table.data_ptr<int16_t>()),
              reinterpret_cast<const float*>(nb[ROOTS].data_ptr()), w, W, F, out, turns);
    return std::any_of(w, w + W, [](int64_t id) { return id != 0; }) ? 1.0f : 0.0f;
  }
  return bundled_key(floats(key_table), nb[ROW_OFFSETS].data_ptr<int64_t>(), w, W, F, out);
}

// A memory's read key K_t of the last decoded byte, kept for the next byte, whose write key K_{t-1} it is: so a byte
// forms one key per memory, not two. ids [B, W] (the window it was formed from; -1: none yet) and keys [B, 2F + 1]
// (the key, then its scale), a cache's `key_memo` (decode_step.py). A row is used only where its ids are the window
// asked for, so one left stale (by a crop, a reorder, a step the PyTorch path took) is never read. Empty: no memo.
struct KeyMemo {
  int64_t* ids = nullptr;
  float* keys = nullptr;
  int64_t W = 0, F = 0;

  KeyMemo() = default;
  KeyMemo(const torch::Tensor& ids_, const torch::Tensor& keys_, int64_t B, int64_t W_, int64_t F_) : W(W_), F(F_) {
    if (ids_.numel() == 0) return;
    TORCH_CHECK(ids_.scalar_type() == torch::kLong && ids_.is_contiguous() && ids_.sizes().equals({B, W}) &&
                keys_.scalar_type() == torch::kFloat && keys_.is_contiguous() && keys_.sizes().equals({B, 2 * F + 1}),
                "key memo: ids [B, W] int64 and keys [B, 2F + 1] fp32");
    ids = ids_.data_ptr<int64_t>();
    keys = keys_.data_ptr<float>();
  }
  // row b's key and scale if they are those of window w[0..W-1], else nullptr
  const float* find(int64_t b, const int64_t* w) const {
    return ids && std::equal(w, w + W, ids + b * W) ? keys + b * (2 * F + 1) : nullptr;
  }
  void keep(int64_t b, const int64_t* w, const float* key, float scale) {
    if (!ids) return;
    std::copy(w, w + W, ids + b * W);
    std::copy(key, key + 2 * F, keys + b * (2 * F + 1));
    keys[b * (2 * F + 1) + 2 * F] = scale;
  }
};

// β's logit from the gate: out(gelu(conv(embed(last G ids)))), the conv one product over the window
float gate_logit(const std::vector<torch::Tensor>& nb, const int64_t* ids, int64_t G, float* scratch) {
  const int64_t E = nb[GATE_EMBED].size(1);
  const float *embed = floats(nb[GATE_EMBED]), *conv = floats(nb[GATE_CONV_W]), *bias = floats(nb[GATE_CONV_B]);
  float* window = scratch;  // [E, G], channel-major like conv.weight [E_out, E_in, G]
  for (int64_t g = 0; g < G; ++g)
    for (int64_t e = 0; e < E; ++e) window[e * G + g] = embed[ids[g] * E + e];
  float* hidden = scratch + E * G;
  matvec(conv, bias, window, hidden, E, E * G);
  float logit = floats(nb[GATE_OUT_B])[0];
  const float* out = floats(nb[GATE_OUT_W]);
  for (int64_t e = 0; e < E; ++e) logit += out[e] * gelu(hidden[e]);
  return logit;
}

// The read trust of read_trust.py on one position, in place: r [V] the read, t [V] the trunk's logits. z = (read -
// mean) / std (unbiased, at least 1e-6), φ = [1, log max(z₁, 1e-3), log(1 + z₁ - z₂), trunk entropy, trunk's top
// log-probability, trunk's log-probability of z's first argmax], k = softplus(θ · φ), and r becomes
// r / sqrt(1 + σ² e^{-2 log c}) + k relu(z - τ), σ² the variance of every read but the largest
// (ReadTrust.forward_reference, the oracle). trust: θ [6], τ, log c (trust_numbers).
// What trust_row computes from a row before it changes it: the backward (read_trust_backward) needs it again.
struct TrustRow {
  double mean, rest_mean;  // of the whole row, and of every read but the largest
  float std_, variance;    // the std z divides by (at least 1e-6), σ² (at least 0)
  bool std_floored, variance_floored;
  int64_t best, second;    // z's first argmax and the runner-up (topk(2))
  float z1, z2, t_max, log_z, entropy, x, k, tau, linear;
  float phi[6];
};

// e^x for x <= 0 (a softmax's exponents) in plain arithmetic that vectorises, where std::exp is a scalar call:
// 2^n · e^r with n = round(x / ln 2) and |r| <= ln 2 / 2, e^r by Cephes' expf polynomial (within 2 ulp). Adding
// and taking away 1.5 · 2^23 rounds to an integer without a call. Below -87 (where e^x is under fp32's smallest
// normal) it returns e^-87 instead: a softmax never feels the difference.
inline float exp_nonpositive(float x) {
  constexpr float round_shift = 12582912.0f;  // 1.5 · 2^23
  x = x < -87.0f ? -87.0f : x;
  const float n = (x * 1.44269504f + round_shift) - round_shift;
  const float r = (x - n * 0.693359375f) + n * 2.12194440e-4f;  // ln 2 in two parts keeps r exact
  const float p = ((((1.9875691500e-4f * r + 1.3981999507e-3f) * r + 8.3334519073e-3f) * r + 4.1665795894e-2f) * r +
                   1.6666665459e-1f) * r + 5.0000001201e-1f;
  const int32_t bits = (static_cast<int32_t>(n) + 127) << 23;  // 2^n
  float scale;
  std::memcpy(&scale, &bits, sizeof scale);
  return (p * r * r + r + 1.0f) * scale;
}

// The first index of the largest x[i] over i != skip (skip -1: none; NaN never wins). Each of LANES lanes keeps its
// own best in a loop that vectorises (a branch per entry, the scalar way, was the slowest part of a row's trust).
int64_t first_argmax(const float* __restrict__ x, int64_t V, int64_t skip = -1) {
  constexpr int64_t LANES = 16;
  const float lowest = -std::numeric_limits<float>::infinity();
  float best[LANES];
  int32_t where[LANES];  // 32-bit, as wide as the floats: one vector each
  std::fill(best, best + LANES, lowest);
  std::fill(where, where + LANES, static_cast<int32_t>(V));
  const int64_t whole = V - V % LANES;
  for (int32_t i = 0; i < whole; i += LANES) {
    #pragma omp simd
    for (int32_t l = 0; l < LANES; ++l) {
      const float v = i + l == skip ? lowest : x[i + l];
      where[l] = v > best[l] ? i + l : where[l];
      best[l] = v > best[l] ? v : best[l];
    }
  }
  float top = lowest;
  int64_t at = V;
  for (int64_t l = 0; l < LANES; ++l)
    if (best[l] > top || (best[l] == top && where[l] < at)) top = best[l], at = where[l];
  for (int64_t i = whole; i < V; ++i)
    if (i != skip && x[i] > top) top = x[i], at = i;
  return at < V ? at : (skip == 0 ? 1 : 0);  // every entry NaN or -inf: the first (but skip)
}

TrustRow trust_statistics(const float* __restrict__ r, const float* __restrict__ t, int64_t V, const float* trust) {
  TrustRow s{};
  double sum = 0.0, squares = 0.0;
  #pragma omp simd reduction(+ : sum, squares)
  for (int64_t i = 0; i < V; ++i) {
    sum += r[i];
    squares += static_cast<double>(r[i]) * r[i];
  }
  s.mean = sum / V;
  double centred = 0.0;
  #pragma omp simd reduction(+ : centred)
  for (int64_t i = 0; i < V; ++i) centred += (r[i] - s.mean) * (r[i] - s.mean);
  const float unfloored = static_cast<float>(std::sqrt(centred / (V - 1)));
  s.std_floored = unfloored < 1e-6f;
  s.std_ = std::max(unfloored, 1e-6f);
  s.best = first_argmax(r, V);
  s.second = first_argmax(r, V, s.best);
  s.z1 = static_cast<float>((r[s.best] - s.mean) / s.std_);
  s.z2 = static_cast<float>((r[s.second] - s.mean) / s.std_);
  const double top = r[s.best];
  s.rest_mean = (sum - top) / (V - 1);
  const double variance = (squares - top * top) / (V - 1) - s.rest_mean * s.rest_mean;
  s.variance_floored = variance < 0.0;
  s.variance = static_cast<float>(std::max(variance, 0.0));
  s.t_max = t[first_argmax(t, V)];
  float normaliser = 0.0f, weighted = 0.0f;  // Σ e_i and Σ e_i (t_i - max), e_i = exp(t_i - max)
  #pragma omp simd reduction(+ : normaliser, weighted)
  for (int64_t i = 0; i < V; ++i) {
    const float e = exp_nonpositive(t[i] - s.t_max);
    normaliser += e;
    weighted += e * (t[i] - s.t_max);
  }
  s.log_z = s.t_max + std::log(normaliser);
  s.entropy = s.log_z - s.t_max - weighted / normaliser;  // -Σ p log p = log Z - Σ p t
  const float phi[6] = {1.0f, std::log(std::max(s.z1, 1e-3f)), std::log(1.0f + s.z1 - s.z2), s.entropy,
                        s.t_max - s.log_z, t[s.best] - s.log_z};
  std::copy(phi, phi + 6, s.phi);
  s.x = 0.0f;
  for (int i = 0; i < 6; ++i) s.x += phi[i] * trust[i];
  s.k = s.x > 20.0f ? s.x : std::log1p(std::exp(s.x));  // F.softplus (β 1, threshold 20)
  s.tau = std::max(trust[6], 0.0f);
  s.linear = 1.0f / std::sqrt(1.0f + s.variance * std::exp(-2.0f * trust[7]));
  return s;
}

// `kept`, when given, receives the row's statistics (training keeps them for the backward)
void trust_row(float* __restrict__ r, const float* __restrict__ t, int64_t V, const float* trust,
               TrustRow* kept = nullptr) {
  const TrustRow s = trust_statistics(r, t, V, trust);
  if (kept != nullptr) *kept = s;
  #pragma omp simd
  for (int64_t i = 0; i < V; ++i) {
    const float z = static_cast<float>((r[i] - s.mean) / s.std_);
    r[i] = r[i] * s.linear + s.k * std::max(z - s.tau, 0.0f);
  }
}

// The vector-Jacobian product of trust_row for one row of statistics s: g [V] the gradient of its output -> gr [V]
// of the read, gt [V] of the trunk's logits, and gp [8] of θ, τ and log c (ReadTrust.forward_reference under
// autograd, the oracle: the same subgradients at the floors, the clamps and the maxima). z [V] is scratch.
void trust_row_backward(const float* __restrict__ r, const float* __restrict__ t, const float* __restrict__ g,
                        int64_t V, const float* trust, const TrustRow& s, float* __restrict__ gr,
                        float* __restrict__ gt, float* __restrict__ gp, float* __restrict__ z) {
  const float n = static_cast<float>(V - 1);
  float g_linear = 0.0f, g_k = 0.0f, g_tau = 0.0f;
  #pragma omp simd reduction(+ : g_linear, g_k, g_tau)
  for (int64_t i = 0; i < V; ++i) {
    z[i] = static_cast<float>((r[i] - s.mean) / s.std_);
    const bool active = z[i] - s.tau > 0.0f;
    g_linear += g[i] * r[i];
    g_k += active ? g[i] * (z[i] - s.tau) : 0.0f;
    g_tau -= active ? g[i] * s.k : 0.0f;
  }
  // out = r · ℓ + k relu(z - τ), ℓ = (1 + σ² e)^(-1/2) with e = exp(-2 log c)
  const float e = std::exp(-2.0f * trust[7]), cubed = s.linear * s.linear * s.linear;
  const float g_variance = s.variance_floored ? 0.0f : -0.5f * g_linear * e * cubed;
  gp[7] = g_linear * cubed * s.variance * e;
  gp[6] = trust[6] >= 0.0f ? g_tau : 0.0f;
  const float g_x = g_k * (s.x > 20.0f ? 1.0f : 1.0f / (1.0f + std::exp(-s.x)));  // softplus' = sigmoid
  float g_phi[6];
  for (int i = 0; i < 6; ++i) {
    gp[i] = g_x * s.phi[i];
    g_phi[i] = g_x * trust[i];
  }
  // φ₁ = log max(z₁, 1e-3), φ₂ = log(1 + z₁ - z₂): the gradients of z at its two largest entries
  const float margin = 1.0f / (1.0f + s.z1 - s.z2);
  const float g_z1 = (s.z1 >= 1e-3f ? g_phi[1] / s.z1 : 0.0f) + g_phi[2] * margin, g_z2 = -g_phi[2] * margin;
  // φ₃ = H, φ₄ = max log p, φ₅ = log p of z's argmax, p = softmax(t): ∂H/∂t_i = -p_i (log p_i + H)
  #pragma omp simd
  for (int64_t i = 0; i < V; ++i) {  // the one-hot parts of φ₄ and φ₅ are added below
    const float log_p = t[i] - s.log_z, p = exp_nonpositive(log_p);
    gt[i] = -g_phi[3] * p * (log_p + s.entropy) - (g_phi[4] + g_phi[5]) * p;
  }
  // φ₄ = amax of log p: its gradient is shared evenly among tied maxima, as torch.amax's
  int64_t tied = 0;
  #pragma omp simd reduction(+ : tied)
  for (int64_t i = 0; i < V; ++i) tied += t[i] == s.t_max;
  const float g_top = g_phi[4] / static_cast<float>(std::max<int64_t>(tied, 1));
  #pragma omp simd
  for (int64_t i = 0; i < V; ++i) gt[i] += t[i] == s.t_max ? g_top : 0.0f;
  gt[s.best] += g_phi[5];
  // z = (r - mean) / std: ∂r_j = (∂z_j - mean(∂z)) / std - z_j Σ(∂z z) / ((V - 1) std), the last term only where
  // the std is above its floor
  float sum_gz = 0.0f, sum_gzz = 0.0f;
  #pragma omp simd reduction(+ : sum_gz, sum_gzz)
  for (int64_t i = 0; i < V; ++i) {
    float gz = z[i] - s.tau > 0.0f ? g[i] * s.k : 0.0f;
    gz += i == s.best ? g_z1 : 0.0f;
    gz += i == s.second ? g_z2 : 0.0f;
    gr[i] = gz;  // kept here until the sums are known
    sum_gz += gz;
    sum_gzz += gz * z[i];
  }
  const float through_std = s.std_floored ? 0.0f : sum_gzz / n;
  #pragma omp simd
  for (int64_t i = 0; i < V; ++i) {
    // σ²: the variance of every read but the largest, ∂σ²/∂r_i = 2 (r_i - rest mean) / (V - 1), 0 at the largest
    const float via_variance = i == s.best ? 0.0f : g_variance * 2.0f * static_cast<float>(r[i] - s.rest_mean) / n;
    gr[i] = g[i] * s.linear + via_variance + (gr[i] - sum_gz / V - z[i] * through_std) / s.std_;
  }
}

// θ [6], τ [] and log c [] (ReadTrust's parameters, fp32) as the 8 numbers trust_row takes
std::array<float, 8> trust_numbers(const torch::Tensor& weights, const torch::Tensor& threshold,
                                   const torch::Tensor& log_noise_cap) {
  for (const auto* t : {&weights, &threshold, &log_noise_cap})
    TORCH_CHECK(t->scalar_type() == torch::kFloat && t->is_contiguous() && t->device().is_cpu(), "trust: fp32");
  TORCH_CHECK(weights.numel() == 6 && threshold.numel() == 1 && log_noise_cap.numel() == 1, "trust: θ [6], τ, log c");
  std::array<float, 8> out;
  std::copy(floats(weights), floats(weights) + 6, out.begin());
  out[6] = floats(threshold)[0];
  out[7] = floats(log_noise_cap)[0];
  return out;
}

// One memory's step for row b: its new spectrum, keep · old + coeff · value ⊙ K_{t-1}, into `spectrum`, and its read
// M ⊙ conj(K_t) scattered into that row's bins of the N-point read (half weight at DC and Nyquist).
void write_and_bin(const float* __restrict__ value, const torch::Tensor& old_spectrum, torch::Tensor& spectrum,
                   torch::Tensor& bins, int64_t b, const float* __restrict__ kp, const float* __restrict__ kn,
                   float keep, float coeff, const std::vector<int32_t>& bin_of) {
  const int64_t F = spectrum.size(1), N = bins.size(1);
  const float* __restrict__ old = reinterpret_cast<const float*>(old_spectrum.data_ptr()) + 2 * F * b;
  float* __restrict__ mem = reinterpret_cast<float*>(spectrum.data_ptr()) + 2 * F * b;
  float* bin = reinterpret_cast<float*>(bins.data_ptr()) + 2 * N * b;
  for (int64_t f = 0; f < F; ++f) {
    const float vr = value[2 * f], vi = value[2 * f + 1], kr = kp[2 * f], ki = kp[2 * f + 1];
    const float sr = keep * old[2 * f] + coeff * (vr * kr - vi * ki);
    const float si = keep * old[2 * f + 1] + coeff * (vr * ki + vi * kr);
    mem[2 * f] = sr;
    mem[2 * f + 1] = si;
    const float half = (f == 0 || f == F - 1) ? 0.5f : 1.0f;  // DC and Nyquist
    bin[bin_of[f]] += half * (sr * kn[2 * f] + si * kn[2 * f + 1]);  // M ⊙ conj(K_t)
    bin[bin_of[f] + 1] += half * (si * kn[2 * f] - sr * kn[2 * f + 1]);
  }
}

}  // namespace

// One decoded byte for each of B sequences, no autograd: the trunk's blocks, final norm and head, then (when
// `notebook` is not empty) the notebook's β (gate and/or the trunk's surprise), keep factor, keys, write and the
// bins of its read, whose N-point FFT gives the read, and the read trust where its tensors are not empty. ids [B, 1];
// numbers: layer-norm eps, then for a notebook period N, read gain, forgetting (0/1), forget_max, keep_clamp, key
// window W, gate window G, uses surprise (0/1), a repeat bank's window W' (0: none). -> (nothing where a weight or
// state is not a contiguous fp32 CPU tensor or an id is outside the vocabulary: the PyTorch step runs, and says what
// is wrong) logits [B, 1, V] (trunk + memory), the trunk's logits [B, 1, V], the memory's [B, 1, V] (empty without a
// notebook), β [B], then the new state: per block integrator and conv tail, then spectrum, tail and last logits (and
// a repeat bank's spectrum). `reuse`, when given, is the outputs of an earlier call of the same shapes that nothing
// reads any more: they are written instead of new ones.
std::vector<torch::Tensor> decode_step_into(const std::vector<torch::Tensor>& trunk,
                                            const std::vector<torch::Tensor>& trunk_state, const torch::Tensor& ids,
                                            const std::vector<torch::Tensor>& nb, const std::vector<double>& numbers,
                                            const std::vector<torch::Tensor>* reuse) {
  TORCH_CHECK(trunk.size() >= TRUNK_HEAD && (trunk.size() - TRUNK_HEAD) % BLOCK_TENSORS == 0, "trunk tensors");
  const int64_t n_layers = (trunk.size() - TRUNK_HEAD) / BLOCK_TENSORS;
  TORCH_CHECK(static_cast<int64_t>(trunk_state.size()) == 2 * n_layers, "two state tensors per block");
  if (!all_floats(trunk) || !all_floats(trunk_state)) return {};  // weights cast since decode_step.py listed them
  TORCH_CHECK(ids.scalar_type() == torch::kLong && ids.dim() == 2 && ids.size(1) == 1 && ids.is_contiguous(),
              "ids [B, 1] int64");
  const int64_t B = ids.size(0), V = trunk[0].size(0), D = trunk[0].size(1), H = trunk[TRUNK_HEAD + 14].size(0);
  const int64_t K = trunk[TRUNK_HEAD + 8].size(0);
  if (!in_range(ids, V)) return {};
  const float eps = static_cast<float>(numbers.at(0));
  std::vector<Block> blocks;
  for (int64_t l = 0; l < n_layers; ++l) {
    blocks.emplace_back(trunk.data() + TRUNK_HEAD + BLOCK_TENSORS * l);
    TORCH_CHECK(trunk_state[2 * l].numel() == B * D && trunk_state[2 * l + 1].numel() == B * (K - 1) * D,
                "block state [B, D] and [B, K-1, D]");
  }
  auto options = trunk[0].options();
  // output slot i of `reuse`, else a new tensor
  const auto output = [reuse](size_t slot, at::IntArrayRef shape, const at::TensorOptions& made_as) {
    return reuse ? (*reuse)[slot] : torch::empty(shape, made_as);
  };
  auto logits = output(1, {B, 1, V}, options);  // the trunk's; the memory's and their sum are made alike
  std::vector<torch::Tensor> integrators, conv_tails;
  for (int64_t l = 0; l < n_layers; ++l) {
    integrators.push_back(output(4 + 2 * l, {B, D}, options));
    conv_tails.push_back(output(5 + 2 * l, {B, K - 1, D}, options));
  }
  const bool with_notebook = !nb.empty();
  torch::Tensor reads = torch::empty({0}, options), betas = reads, spectrum, tail, last_logits, bins;
  torch::Tensor repeat_spectrum, repeat_bins;
  int64_t F = 0, L = 0, N = 0, W = 0, G = 0, W2 = 0;
  if (with_notebook) {
    TORCH_CHECK(nb.size() == NOTEBOOK_TENSORS && numbers.size() == 10, "notebook tensors and numbers");
    F = nb[WRITE_VALUES].size(1), L = nb[TAIL].size(1), N = static_cast<int64_t>(numbers[1]);
    W = static_cast<int64_t>(numbers[6]), G = static_cast<int64_t>(numbers[7]), W2 = static_cast<int64_t>(numbers[9]);
    TORCH_CHECK(nb[SPECTRUM].scalar_type() == torch::kComplexFloat && nb[SPECTRUM].is_contiguous() &&
                !nb[SPECTRUM].is_conj() && nb[SPECTRUM].size(0) == B && nb[SPECTRUM].size(1) == F,
                "spectrum [B, F] complex64");
    TORCH_CHECK(nb[TAIL].scalar_type() == torch::kLong && nb[TAIL].is_contiguous() && nb[TAIL].size(0) == B &&
                L >= W && (G == 0 || L >= G - 1), "tail [B, L] int64");
    TORCH_CHECK(nb[WRITE_VALUES].scalar_type() == torch::kComplexFloat && nb[WRITE_VALUES].is_contiguous() &&
                nb[WRITE_VALUES].size(0) == V, "write values [V, F] complex64");
    check_ids(nb[TAIL], V, "tail ids");
    if (nb[ROOTS].numel()) {
      TORCH_CHECK(nb[KEY_TABLE].scalar_type() == torch::kShort && nb[KEY_TABLE].size(0) == W &&
                  nb[KEY_TABLE].size(1) == F && nb[KEY_TABLE].is_contiguous() && nb[ROOTS].numel() == KEY_TURNS,
                  "key frequencies [W, F] int16 residues mod Q = 2^16");
      TORCH_CHECK(nb[ROOTS].scalar_type() == torch::kComplexFloat, "roots of unity complex64");
    } else {
      TORCH_CHECK(nb[KEY_TABLE].scalar_type() == torch::kFloat && nb[KEY_TABLE].is_contiguous() &&
                  nb[KEY_TABLE].size(1) == 2 * F && nb[ROW_OFFSETS].numel() == W, "role rows [W·V, 2F] fp32");
      check_ids(nb[ROW_OFFSETS], nb[KEY_TABLE].size(0) - V + 1, "row offsets");
    }
    if (numbers[8] != 0.0) TORCH_CHECK(nb[LAST_LOGITS].numel() == B * V, "last logits [B, V]");
    if (W2) {
      TORCH_CHECK(nb[ROOTS].numel() && W2 < W && nb[REPEAT_KEY_TABLE].scalar_type() == torch::kShort &&
                  nb[REPEAT_KEY_TABLE].size(0) == W2 && nb[REPEAT_KEY_TABLE].size(1) == F &&
                  nb[REPEAT_KEY_TABLE].is_contiguous(), "repeat bank: bound keys, residues [W', F] int16, W' < W");
      TORCH_CHECK(nb[REPEAT_SPECTRUM].scalar_type() == torch::kComplexFloat && nb[REPEAT_SPECTRUM].is_contiguous() &&
                  !nb[REPEAT_SPECTRUM].is_conj() && nb[REPEAT_SPECTRUM].size(0) == B &&
                  nb[REPEAT_SPECTRUM].size(1) == F && nb[REPEAT_READ_SCALE].numel() == 1,
                  "repeat spectrum [B, F] complex64 and its read scale");
    }
    if (G) {
      const int64_t E = nb[GATE_EMBED].size(1);
      TORCH_CHECK(nb[GATE_EMBED].size(0) == V && nb[GATE_CONV_W].numel() == E * E * G && nb[GATE_CONV_B].numel() == E &&
                  nb[GATE_OUT_W].numel() == E && nb[GATE_OUT_B].numel() == 1, "gate: embed [V, E], conv [E, E, G], "
                  "out [1, E]");
      TORCH_CHECK(std::all_of(nb.begin() + GATE_EMBED, nb.begin() + GATE_OUT_B + 1, [](const torch::Tensor& t) {
        return t.scalar_type() == torch::kFloat && t.is_contiguous(); }), "gate: contiguous fp32");
    }
    reads = output(2, {B, 1, V}, options);
    betas = output(3, {B}, options);
    spectrum = output(4 + 2 * n_layers, {B, F}, nb[SPECTRUM].options());
    tail = output(5 + 2 * n_layers, {B, L}, nb[TAIL].options());
    last_logits = numbers[8] != 0.0 ? logits.view({B, V}) : nb[LAST_LOGITS];
    bins = torch::zeros({B, N}, nb[SPECTRUM].options());
    if (W2) {
      repeat_spectrum = output(7 + 2 * n_layers, {B, F}, nb[SPECTRUM].options());
      repeat_bins = torch::zeros({B, N}, nb[SPECTRUM].options());
    }
  }
  std::vector<int32_t> bin_of;
  if (with_notebook) {
    check_ids(nb[FREQUENCIES], N, "frequencies");
    const int64_t* k = nb[FREQUENCIES].data_ptr<int64_t>();
    bin_of.assign(k, k + F);
    for (auto& offset : bin_of) offset *= 2;
  }
  std::vector<float> key_scale_n(B), repeat_key_scale_n(B);
  KeyMemo key_memo = with_notebook ? KeyMemo(nb[KEY_MEMO_IDS], nb[KEY_MEMO], B, W, F) : KeyMemo();
  KeyMemo repeat_key_memo = W2 ? KeyMemo(nb[REPEAT_KEY_MEMO_IDS], nb[REPEAT_KEY_MEMO], B, W2, F) : KeyMemo();
  // the trunk, all rows at once: each linear layer one product over the rows (linear_rows), the rest row by row
  std::vector<float> work(7 * B * D + B * H);
  float *h = work.data(), *u = h + B * D, *v = u + B * D, *a = v + B * D, *m = a + B * D, *c = m + B * D,
        *mixed = c + B * D, *hidden = mixed + B * D;
  const int64_t* x_ids = ids.data_ptr<int64_t>();
  for (int64_t b = 0; b < B; ++b) std::copy(floats(trunk[0]) + x_ids[b] * D, floats(trunk[0]) + (x_ids[b] + 1) * D,
                                            h + b * D);
  const float *lo = floats(trunk[4]), *width = floats(trunk[5]);
  for (int64_t l = 0; l < n_layers; ++l) {
    const Block& k = blocks[l];
    for (int64_t b = 0; b < B; ++b) layer_norm(h + b * D, k.norm_w, k.norm_b, u + b * D, D, eps);
    linear_rows(k.value_w, k.value_b, u, v, B, D, D);
    linear_rows(k.decay_w, k.decay_b, u, a, B, D, D);
    linear_rows(k.mix_w, k.mix_b, u, m, B, D, D);
    for (int64_t b = 0; b < B; ++b) {
      const float* s_old = floats(trunk_state[2 * l]) + b * D;
      const float* tail_old = floats(trunk_state[2 * l + 1]) + b * (K - 1) * D;  // u_{t-K+1} .. u_{t-1}
      float* s = integrators[l].data_ptr<float>() + b * D;
      float* tail_new = conv_tails[l].data_ptr<float>() + b * (K - 1) * D;
      const float *ub = u + b * D, *vb = v + b * D, *ab = a + b * D, *mb = m + b * D;
      float* mixed_b = mixed + b * D;
      for (int64_t i = 0; i < D; ++i) {
        const float gamma = lo[i] + width[i] * sigmoid(ab[i]);
        s[i] = vb[i] + gamma * (s_old[i] - vb[i]);  // lerp(v, s_old, γ)
        float conv = k.conv_b[i] + k.conv_w[i] * ub[i];  // weight[0] · u_t
        for (int64_t j = 1; j < K; ++j) conv += k.conv_w[j * D + i] * tail_old[(K - 1 - j) * D + i];
        mixed_b[i] = conv + sigmoid(mb[i]) * (s[i] - conv);  // lerp(c, s, sigmoid(W_m u))
      }
      if (K > 1) {  // the window moves on by one input
        std::copy(tail_old + D, tail_old + (K - 1) * D, tail_new);
        std::copy(ub, ub + D, tail_new + (K - 2) * D);
      }
    }
    linear_rows(k.out_w, k.out_b, mixed, c, B, D, D);
    for (int64_t i = 0; i < B * D; ++i) h[i] += c[i];
    for (int64_t b = 0; b < B; ++b) layer_norm(h + b * D, k.ffn_norm_w, k.ffn_norm_b, u + b * D, D, eps);
    linear_rows(k.ffn_in_w, k.ffn_in_b, u, hidden, B, H, D);
    for (int64_t i = 0; i < B * H; ++i) hidden[i] = gelu(hidden[i]);
    linear_rows(k.ffn_out_w, k.ffn_out_b, hidden, c, B, D, H);
    for (int64_t i = 0; i < B * D; ++i) h[i] += c[i];
  }
  for (int64_t b = 0; b < B; ++b) layer_norm(h + b * D, floats(trunk[1]), floats(trunk[2]), u + b * D, D, eps);
  linear_rows(floats(trunk[3]), nullptr, u, logits.data_ptr<float>(), B, V, D);

  if (with_notebook) at::parallel_for(0, B, 1, [&](int64_t first, int64_t last) {
    std::vector<float> scratch(4 * F + (G ? nb[GATE_EMBED].size(1) * (G + 1) : 0));
    std::vector<uint16_t> turns(KEY_BLOCK);
    float *kp = scratch.data(), *kn = kp + 2 * F, *gate_scratch = kn + 2 * F;
    for (int64_t b = first; b < last; ++b) {
      const int64_t x = x_ids[b];
      // the ids with the tail before them: the last W + 1 form both keys, the last G the gate's window
      std::vector<int64_t> with_tail(L + 1);
      const int64_t* old_tail = nb[TAIL].data_ptr<int64_t>() + b * L;
      std::copy(old_tail, old_tail + L, with_tail.begin());
      with_tail[L] = x;
      std::copy(with_tail.begin() + 1, with_tail.end(), tail.data_ptr<int64_t>() + b * L);
      float logit = 0.0f;
      if (G) {
        logit += gate_logit(nb, with_tail.data() + L + 1 - G, G, gate_scratch);
      }
      if (numbers[8] != 0.0) {  // S = logsumexp(last) - last[x], the trunk's surprise at x
        const float* last_row = floats(nb[LAST_LOGITS]) + b * V;
        float top = last_row[0];
        for (int64_t i = 1; i < V; ++i) top = std::max(top, last_row[i]);
        float total = 0.0f;
        for (int64_t i = 0; i < V; ++i) total += std::exp(last_row[i] - top);
        const float surprise = top + std::log(total) - last_row[x];
        logit += floats(nb[SURPRISE_SCALE])[0] * (surprise - floats(nb[SURPRISE_SHIFT])[0]);
      }
      const float beta = sigmoid(logit);
      betas.data_ptr<float>()[b] = beta;
      float keep = 1.0f;
      if (numbers[3] != 0.0) {
        const float g = static_cast<float>(numbers[4]) * sigmoid(floats(nb[FORGET_LOGIT])[0]);
        keep = std::max(1.0f - g * beta, static_cast<float>(numbers[5]));
      }
      const float* value = reinterpret_cast<const float*>(nb[WRITE_VALUES].data_ptr()) + 2 * F * x;
      // each memory: its write key K_{t-1} (from its memo, or formed into kp) and read key K_t (formed into kn, then
      // kept in the memo) from its window, its write and its read's bins; kp and kn serve both memories in turn
      const auto memory_step = [&](const torch::Tensor& key_table, int64_t window, KeyMemo& memo,
                                   const torch::Tensor& old_spectrum, torch::Tensor& new_spectrum,
                                   torch::Tensor& read_bins) {
        const int64_t* w = with_tail.data() + L - window;  // the window ending at t-1, then the one ending at t
        const float* write_key = memo.find(b, w);
        const float write_scale = write_key ? write_key[2 * F] : window_key(key_table, nb, w, window, F, kp,
                                                                            turns.data());
        const float read_scale = window_key(key_table, nb, w + 1, window, F, kn, turns.data());
        write_and_bin(value, old_spectrum, new_spectrum, read_bins, b, write_key ? write_key : kp, kn, keep,
                      beta * write_scale, bin_of);
        memo.keep(b, w + 1, kn, read_scale);  // after the write, which may have read the memo's row
        return read_scale;
      };
      key_scale_n[b] = memory_step(nb[KEY_TABLE], W, key_memo, nb[SPECTRUM], spectrum, bins);
      if (W2) {
        repeat_key_scale_n[b] = memory_step(nb[REPEAT_KEY_TABLE], W2, repeat_key_memo, nb[REPEAT_SPECTRUM],
                                            repeat_spectrum, repeat_bins);
      }
    }
  });
  const auto state_outputs = [&](std::vector<torch::Tensor> outputs) {
    for (int64_t l = 0; l < n_layers; ++l) {
      outputs.push_back(integrators[l]);
      outputs.push_back(conv_tails[l]);
    }
    return outputs;
  };
  if (!with_notebook) return state_outputs({logits, logits, reads, betas});
  // the read: gain · Re FFT_N(bins)[:V], times σ_t and the read scale; a repeat bank's added, before one trust of
  // the sum or after a trust of its own (repeat_read_trust, as Notebook.trusted)
  const auto transformed = torch::fft::fft(bins, c10::nullopt, -1).resolve_conj().contiguous();
  const float* spectrum_out = reinterpret_cast<const float*>(transformed.data_ptr());
  const float gain = static_cast<float>(numbers[2]) * floats(nb[READ_SCALE])[0];
  const bool trusted = nb[TRUST_WEIGHTS].numel(), repeat_trusted = W2 && nb[REPEAT_TRUST_WEIGHTS].numel();
  std::array<float, 8> trust{}, repeat_trust{};
  if (trusted) {
    if (!all_floats({nb[TRUST_WEIGHTS], nb[TRUST_THRESHOLD], nb[TRUST_LOG_NOISE_CAP]})) return {};  // cast since listed
    trust = trust_numbers(nb[TRUST_WEIGHTS], nb[TRUST_THRESHOLD], nb[TRUST_LOG_NOISE_CAP]);
  }
  if (repeat_trusted) {
    if (!all_floats({nb[REPEAT_TRUST_WEIGHTS], nb[REPEAT_TRUST_THRESHOLD], nb[REPEAT_TRUST_LOG_NOISE_CAP]})) return {};
    repeat_trust = trust_numbers(nb[REPEAT_TRUST_WEIGHTS], nb[REPEAT_TRUST_THRESHOLD], nb[REPEAT_TRUST_LOG_NOISE_CAP]);
  }
  torch::Tensor repeat_transformed;
  std::vector<float> repeat_row(W2 ? V : 0);
  if (W2) {
    if (!all_floats({nb[REPEAT_READ_SCALE]})) return {};
    repeat_transformed = torch::fft::fft(repeat_bins, c10::nullopt, -1).resolve_conj().contiguous();
  }
  auto total = output(0, {B, 1, V}, options);
  for (int64_t b = 0; b < B; ++b) {
    const float factor = gain * key_scale_n[b];
    float* row = reads.data_ptr<float>() + b * V;
    const float* trunk_row = logits.data_ptr<float>() + b * V;
    for (int64_t i = 0; i < V; ++i) row[i] = factor * spectrum_out[2 * (b * N + i)];
    if (W2) {
      const float repeat_factor = static_cast<float>(numbers[2]) * floats(nb[REPEAT_READ_SCALE])[0] *
                                  repeat_key_scale_n[b];
      const float* repeat_out = reinterpret_cast<const float*>(repeat_transformed.data_ptr()) + 2 * b * N;
      for (int64_t i = 0; i < V; ++i) repeat_row[i] = repeat_factor * repeat_out[2 * i];
      if (repeat_trusted) {
        trust_row(row, trunk_row, V, trust.data());
        trust_row(repeat_row.data(), trunk_row, V, repeat_trust.data());
      }
      for (int64_t i = 0; i < V; ++i) row[i] += repeat_row[i];
    }
    if (trusted && !repeat_trusted) trust_row(row, trunk_row, V, trust.data());
    float* sum = total.data_ptr<float>() + b * V;
    for (int64_t i = 0; i < V; ++i) sum[i] = trunk_row[i] + row[i];
  }
  auto outputs = state_outputs({total, logits, reads, betas});
  outputs.insert(outputs.end(), {spectrum, tail, last_logits});
  if (W2) outputs.push_back(repeat_spectrum);
  return outputs;
}

std::vector<torch::Tensor> decode_step(std::vector<torch::Tensor> trunk, std::vector<torch::Tensor> trunk_state,
                                       torch::Tensor ids, std::vector<torch::Tensor> nb, std::vector<double> numbers) {
  return decode_step_into(trunk, trunk_state, ids, nb, numbers, nullptr);
}

// ---- greedy decoding: generate's loop without Python between the bytes (greedy_generation.py) ---------------------

// `steps` greedy bytes from ids [B, 1] (each sequence's last chosen byte, not yet read): per step decode_step, the
// first largest logit (as torch.argmax), a finished sequence's byte replaced by `pad`, and `unfinished` [B] int64
// (1: still generating) cleared where the byte is one of `eos` [E] (empty: none finishes; no pad then), as
// GenerationMixin._sample does; stops early once every sequence has finished. -> the chosen bytes [B, n], n <= steps,
// then the state after the last byte read, in decode_step's order (per block integrator and conv tail, then
// spectrum, tail, last logits and a repeat bank's spectrum); nothing where decode_step declines.
std::vector<torch::Tensor> decode_greedy(std::vector<torch::Tensor> trunk, std::vector<torch::Tensor> trunk_state,
                                         torch::Tensor ids, std::vector<torch::Tensor> nb, std::vector<double> numbers,
                                         int64_t steps, torch::Tensor eos, int64_t pad, torch::Tensor unfinished) {
  TORCH_CHECK(steps >= 1, "at least one step");
  TORCH_CHECK(ids.scalar_type() == torch::kLong && ids.dim() == 2 && ids.size(1) == 1, "ids [B, 1] int64");
  const int64_t B = ids.size(0), n_state = static_cast<int64_t>(trunk_state.size());
  check_ids(eos, trunk[0].size(0), "eos ids");
  TORCH_CHECK(unfinished.scalar_type() == torch::kLong && unfinished.is_contiguous() && unfinished.numel() == B,
              "unfinished [B] int64");
  const int64_t *stop = eos.data_ptr<int64_t>(), n_eos = eos.numel();
  int64_t* open = unfinished.data_ptr<int64_t>();
  const bool repeat_bank = !nb.empty() && numbers.size() == 10 && numbers[9] != 0.0;
  auto chosen = torch::empty({B, steps}, ids.options());
  auto current = ids.clone().contiguous();
  int64_t done = 0;
  bool any_open = true;
  std::vector<torch::Tensor> previous, older;  // a step reads the outputs of the one before and writes the older's
  while (done < steps && any_open) {
    auto out = decode_step_into(trunk, trunk_state, current, nb, numbers, older.empty() ? nullptr : &older);
    if (out.empty()) return {};
    const int64_t V = out[0].size(2);
    const float* logits = out[0].data_ptr<float>();
    any_open = n_eos == 0;
    for (int64_t b = 0; b < B; ++b) {
      const float* row = logits + b * V;
      int64_t best = std::max_element(row, row + V) - row;  // the first of equal largest, as torch.argmax
      if (n_eos) {
        if (!open[b]) best = pad;
        if (std::find(stop, stop + n_eos, best) != stop + n_eos) open[b] = 0;
        any_open |= open[b] != 0;
      }
      chosen.data_ptr<int64_t>()[b * steps + done] = best;
      current.data_ptr<int64_t>()[b] = best;
    }
    ++done;
    older = std::move(previous);
    previous = out;
    std::copy(out.begin() + 4, out.begin() + 4 + n_state, trunk_state.begin());
    if (!nb.empty()) {
      nb[SPECTRUM] = out[4 + n_state];
      nb[TAIL] = out[5 + n_state];
      nb[LAST_LOGITS] = out[6 + n_state];
      if (repeat_bank) nb[REPEAT_SPECTRUM] = out[7 + n_state];
    }
  }
  std::vector<torch::Tensor> result{chosen.narrow(1, 0, done).contiguous()};
  result.insert(result.end(), trunk_state.begin(), trunk_state.end());
  if (!nb.empty()) result.insert(result.end(), {nb[SPECTRUM], nb[TAIL], nb[LAST_LOGITS]});
  if (repeat_bank) result.push_back(nb[REPEAT_SPECTRUM]);
  return result;
}

// ---- the read trust alone, without autograd (as PyTorch ops some twenty small calls) ------------------------------

// reads and trunk logits [M, V], the trust's θ [6], τ and log c -> the memory's logits [M, V] (trust_row per position).
// reads [M, V] and trunk_logits [M, V] fp32 -> the memory's logits [M, V], and with keep_statistics each row's
// statistics (opaque bytes [M, sizeof(TrustRow)], for read_trust_backward; else empty)
std::vector<torch::Tensor> read_trust(torch::Tensor reads, torch::Tensor trunk_logits, torch::Tensor weights,
                                      torch::Tensor threshold, torch::Tensor log_noise_cap, bool keep_statistics) {
  TORCH_CHECK(reads.scalar_type() == torch::kFloat && reads.is_contiguous() && reads.dim() == 2, "reads [M, V] fp32");
  TORCH_CHECK(trunk_logits.scalar_type() == torch::kFloat && trunk_logits.is_contiguous() &&
              trunk_logits.sizes() == reads.sizes(), "trunk logits like reads");
  const auto trust = trust_numbers(weights, threshold, log_noise_cap);
  const int64_t M = reads.size(0), V = reads.size(1);
  TORCH_CHECK(V >= 3, "at least three ids");
  auto out = reads.clone();
  auto statistics = torch::empty({keep_statistics ? M : 0, static_cast<int64_t>(sizeof(TrustRow))},
                                 reads.options().dtype(torch::kByte));
  auto* kept = reinterpret_cast<TrustRow*>(statistics.data_ptr());
  at::parallel_for(0, M, 1, [&](int64_t first, int64_t last) {
    for (int64_t m = first; m < last; ++m)
      trust_row(out.data_ptr<float>() + m * V, floats(trunk_logits) + m * V, V, trust.data(),
                keep_statistics ? kept + m : nullptr);
  });
  return {out, statistics};
}

// The backward of read_trust: its inputs, its kept statistics and grad [M, V] of its output -> the gradients of
// reads [M, V], trunk_logits [M, V], and per row of θ, τ and log c [M, 8] (summed by the caller)
std::vector<torch::Tensor> read_trust_backward(torch::Tensor reads, torch::Tensor trunk_logits, torch::Tensor statistics,
                                               torch::Tensor grad, torch::Tensor weights, torch::Tensor threshold,
                                               torch::Tensor log_noise_cap) {
  TORCH_CHECK(reads.scalar_type() == torch::kFloat && reads.is_contiguous() && reads.dim() == 2, "reads [M, V] fp32");
  for (const auto* x : {&trunk_logits, &grad})
    TORCH_CHECK(x->scalar_type() == torch::kFloat && x->is_contiguous() && x->sizes() == reads.sizes(),
                "trunk logits and grad like reads");
  const int64_t M = reads.size(0), V = reads.size(1);
  TORCH_CHECK(statistics.scalar_type() == torch::kByte && statistics.is_contiguous() && statistics.size(0) == M &&
              statistics.size(1) == static_cast<int64_t>(sizeof(TrustRow)), "statistics kept by read_trust");
  const auto trust = trust_numbers(weights, threshold, log_noise_cap);
  const auto* kept = reinterpret_cast<const TrustRow*>(statistics.data_ptr());
  auto grad_reads = torch::empty_like(reads), grad_trunk = torch::empty_like(reads);
  auto grad_numbers = torch::empty({M, 8}, reads.options());
  at::parallel_for(0, M, 1, [&](int64_t first, int64_t last) {
    std::vector<float> z(V);
    for (int64_t m = first; m < last; ++m)
      trust_row_backward(floats(reads) + m * V, floats(trunk_logits) + m * V, floats(grad) + m * V, V, trust.data(),
                         kept[m], grad_reads.data_ptr<float>() + m * V, grad_trunk.data_ptr<float>() + m * V,
                         grad_numbers.data_ptr<float>() + m * 8, z.data());
  });
  return {grad_reads, grad_trunk, grad_numbers};
}
