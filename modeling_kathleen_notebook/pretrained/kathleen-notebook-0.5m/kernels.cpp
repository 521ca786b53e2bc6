// The notebook's compiled CPU kernels: see kernels.py, which builds this file, for what each computes.
#include <torch/extension.h>
#include <ATen/Parallel.h>
#include <vector>

namespace {

// the kernels index tables with these numbers: refuse any outside [0, size) instead of reading past a table
void check_range(const torch::Tensor& indices, int64_t size, const char* what) {
  if (indices.numel() == 0) return;
  const auto [low, high] = torch::aminmax(indices);
  TORCH_CHECK(low.item<int64_t>() >= 0 && high.item<int64_t>() < size, what, " outside [0, ", size, ")");
}

// The rows a chunk reads, as float pointers (re, im interleaved): CV[x_t], and K_{t-1} (K_t is the next row).
// values [V, F], ids [B, C], keys [B, C+1, F] (strided views of the whole sequence's tensors are fine).
struct ChunkRows {
  const torch::Tensor& values;
  const torch::Tensor& ids;
  const torch::Tensor& keys;
  int64_t F, key_b, key_t, id_b, id_t;

  ChunkRows(const torch::Tensor& values_, const torch::Tensor& ids_, const torch::Tensor& keys_)
      : values(values_), ids(ids_), keys(keys_), F(values_.size(1)), key_b(2 * keys_.stride(0)),
        key_t(2 * keys_.stride(1)), id_b(ids_.stride(0)), id_t(ids_.stride(1)) {
    TORCH_CHECK(values.device().is_cpu() && keys.device().is_cpu(), "CPU tensors only");
    TORCH_CHECK(values.scalar_type() == torch::kComplexFloat && keys.scalar_type() == torch::kComplexFloat,
                "complex64 values and keys");
    TORCH_CHECK(values.is_contiguous() && keys.stride(2) == 1, "contiguous value rows and key spectra");
    TORCH_CHECK(!values.is_conj() && !keys.is_conj(), "values and keys without a lazy conjugation");
    TORCH_CHECK(ids.scalar_type() == torch::kLong, "int64 ids");
    TORCH_CHECK(keys.size(1) == ids.size(1) + 1 && keys.size(2) == F, "keys [B, C+1, F]");
    check_range(ids, values.size(0), "value ids");
  }
  const float* value(int64_t b, int64_t t) const {
    return reinterpret_cast<const float*>(values.data_ptr()) + 2 * F * ids.data_ptr<int64_t>()[b * id_b + t * id_t];
  }
  const float* key(int64_t b, int64_t t) const {  // keys[b, t] is K_{t-1}
    return reinterpret_cast<const float*>(keys.data_ptr()) + b * key_b + t * key_t;
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

}  // namespace

// values [V, F], ids [B, C], keys [B, C+1, F] (keys[:, t] is K_{t-1}), coeff [B, C] float, start [B, F] or
// empty, frequencies [F] -> bins [B, C, N] (complex64), the state after the chunk [B, F]
std::vector<torch::Tensor> scan_read_bins(torch::Tensor values, torch::Tensor ids, torch::Tensor keys,
                                          torch::Tensor coeff, torch::Tensor start, torch::Tensor frequencies,
                                          int64_t period) {
  const ChunkRows rows(values, ids, keys);
  const int64_t B = ids.size(0), C = ids.size(1), F = values.size(1);
  auto coeffs = coeff.to(torch::kFloat).contiguous();
  auto starts = start.numel() ? start.resolve_conj().contiguous() : start;
  auto bins = torch::zeros({B, C, period}, values.options());
  auto end = torch::empty({B, F}, values.options());
  TORCH_CHECK(coeffs.numel() == B * C && (!starts.numel() || starts.numel() == B * F), "coeff [B, C], start [B, F]");
  const auto offsets = bin_offsets(frequencies, period);
  at::parallel_for(0, B, 1, [&](int64_t first, int64_t last) {
    std::vector<float> state(2 * F), unbound(2 * F);
    for (int64_t b = first; b < last; ++b) {
      float* __restrict__ s = state.data();
      float* __restrict__ z = unbound.data();
      if (starts.numel()) {
        const float* s0 = reinterpret_cast<const float*>(starts.data_ptr()) + 2 * F * b;
        std::copy(s0, s0 + 2 * F, s);
      } else {
        std::fill(state.begin(), state.end(), 0.0f);
      }
      for (int64_t t = 0; t < C; ++t) {
        const float* __restrict__ v = rows.value(b, t);
        const float* __restrict__ k = rows.key(b, t);      // K_{t-1}
        const float* __restrict__ q = rows.key(b, t + 1);  // K_t
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
        z[0] *= 0.5f; z[1] *= 0.5f; z[2 * F - 2] *= 0.5f; z[2 * F - 1] *= 0.5f;  // DC and Nyquist
        float* h = reinterpret_cast<float*>(bins.data_ptr()) + 2 * period * (b * C + t);
        for (int64_t f = 0; f < F; ++f) {
          h[offsets[f]] += z[2 * f];
          h[offsets[f] + 1] += z[2 * f + 1];
        }
      }
      std::copy(s, s + 2 * F, reinterpret_cast<float*>(end.data_ptr()) + 2 * F * b);
    }
  });
  return {bins, end};
}

// grad_bins [B, C, N]: the adjoint of each position's read before its frequencies are picked; grad_end [B, F]
// -> the gradient of coeff [B, C] and of start [B, F]
std::vector<torch::Tensor> scan_read_bins_backward(torch::Tensor values, torch::Tensor ids, torch::Tensor keys,
                                                   torch::Tensor grad_bins, torch::Tensor grad_end,
                                                   torch::Tensor frequencies) {
  const ChunkRows rows(values, ids, keys);
  const int64_t B = ids.size(0), C = ids.size(1), F = values.size(1), N = grad_bins.size(2);
  // an FFT may hand back a lazily conjugated tensor: its memory holds the unconjugated numbers
  auto adjoint = grad_bins.to(torch::kComplexFloat).resolve_conj().contiguous();
  auto ends = grad_end.to(torch::kComplexFloat).resolve_conj().contiguous();
  TORCH_CHECK(adjoint.size(0) == B && adjoint.size(1) == C && ends.numel() == B * F, "grad_bins [B, C, N], "
              "grad_end [B, F]");
  auto grad_coeff = torch::empty({B, C}, values.options().dtype(torch::kFloat));
  auto grad_start = torch::empty({B, F}, values.options());
  const auto offsets = bin_offsets(frequencies, N);
  at::parallel_for(0, B, 1, [&](int64_t first, int64_t last) {
    std::vector<float> suffix_sum(2 * F), picked(2 * F);
    for (int64_t b = first; b < last; ++b) {
      float* __restrict__ s = suffix_sum.data();  // Σ of the state gradients from t on, and the end's
      float* __restrict__ g = picked.data();
      const float* e = reinterpret_cast<const float*>(ends.data_ptr()) + 2 * F * b;
      std::copy(e, e + 2 * F, s);
      for (int64_t t = C - 1; t >= 0; --t) {
        const float* a = reinterpret_cast<const float*>(adjoint.data_ptr()) + 2 * N * (b * C + t);
        for (int64_t f = 0; f < F; ++f) {
          g[2 * f] = a[offsets[f]];
          g[2 * f + 1] = a[offsets[f] + 1];
        }
        g[0] *= 0.5f; g[1] *= 0.5f; g[2 * F - 2] *= 0.5f; g[2 * F - 1] *= 0.5f;
        const float* __restrict__ v = rows.value(b, t);
        const float* __restrict__ k = rows.key(b, t);
        const float* __restrict__ q = rows.key(b, t + 1);
        float dot = 0.0f;
        #pragma omp simd reduction(+ : dot)
        for (int64_t f = 0; f < F; ++f) {
          const float qr = q[2 * f], qi = q[2 * f + 1];
          const float sr = s[2 * f] + (g[2 * f] * qr - g[2 * f + 1] * qi);  // + adjoint ⊙ K_t
          const float si = s[2 * f + 1] + (g[2 * f] * qi + g[2 * f + 1] * qr);
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
  const int64_t B = ids.size(0), W = row_offsets.numel(), F = values.size(1), R = 2 * (F - 1);
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
    std::fill(previous.begin(), previous.end(), 0.0f);
    std::fill(current.begin(), current.end(), 0.0f);
    for (int64_t i = 0; i < W; ++i) {
      const int64_t offset = offsets_of_rows.data_ptr<int64_t>()[i];
      const float* __restrict__ older = terms + 2 * F * (offset + id[i]);
      const float* __restrict__ newer = terms + 2 * F * (offset + id[i + 1]);
      #pragma omp simd
      for (int64_t j = 0; j < 2 * F; ++j) {
        kp[j] += older[j];
        kn[j] += newer[j];
      }
    }
    float sum_p = 0.0f, sum_n = 0.0f;  // R ‖k‖² = Σ_f m_f |K_f|², m = 2 but 1 at DC and Nyquist (real there)
    #pragma omp simd reduction(+ : sum_p, sum_n)
    for (int64_t j = 0; j < 2 * F; ++j) {
      sum_p += kp[j] * kp[j];
      sum_n += kn[j] * kn[j];
    }
    sum_p = 2.0f * sum_p - kp[0] * kp[0] - kp[2 * F - 2] * kp[2 * F - 2];
    sum_n = 2.0f * sum_n - kn[0] * kn[0] - kn[2 * F - 2] * kn[2 * F - 2];
    const float scale_p = sum_p > 0.0f ? std::sqrt(R / sum_p) : 0.0f;  // a window of padding: a zero key
    const float scale_n = sum_n > 0.0f ? std::sqrt(R / sum_n) : 0.0f;
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
