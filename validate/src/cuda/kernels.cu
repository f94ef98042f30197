/* The kernels of vramplan's `cuda` backend, compiled at run time with NVRTC (validate/src/cuda/
   kernels.rs has their signatures and says how they are launched). Compiled once per element
   type after a `#define VP_DTYPE` (0 fp32, 1 fp16, 2 bf16); 16-bit values are converted by hand,
   so that no CUDA header is needed. Every kernel walks its work with a grid stride and reads and
   writes exactly the elements its operands' dims span. */
typedef unsigned long long ULL;

#if VP_DTYPE == 0
typedef float elem;
__device__ __forceinline__ float ld(elem x) { return x; }
__device__ __forceinline__ elem st(float x) { return x; }
#elif VP_DTYPE == 1
typedef unsigned short elem;
__device__ __forceinline__ float ld(elem h) {
    unsigned int sign = ((unsigned int)h & 0x8000u) << 16;
    unsigned int exponent = ((unsigned int)h >> 10) & 0x1fu;
    unsigned int mantissa = (unsigned int)h & 0x3ffu;
    if (exponent == 0u) {
        float f = (float)mantissa * 5.9604644775390625e-8f;
        return sign ? -f : f;
    }
    if (exponent == 31u) return __uint_as_float(sign | 0x7f800000u | (mantissa << 13));
    return __uint_as_float(sign | ((exponent + 112u) << 23) | (mantissa << 13));
}
__device__ __forceinline__ elem st(float f) {
    unsigned int x = __float_as_uint(f);
    unsigned int sign = (x >> 16) & 0x8000u;
    int exponent = (int)((x >> 23) & 0xffu) - 127 + 15;
    unsigned int mantissa = x & 0x7fffffu;
    if (exponent <= 0) return (elem)sign;
    if (exponent >= 31) return (elem)(sign | 0x7c00u);
    return (elem)(sign | ((unsigned int)exponent << 10) | (mantissa >> 13));
}
#else
typedef unsigned short elem;
__device__ __forceinline__ float ld(elem h) { return __uint_as_float(((unsigned int)h) << 16); }
__device__ __forceinline__ elem st(float f) {
    unsigned int x = __float_as_uint(f);
    x += 0x7fffu + ((x >> 16) & 1u);
    return (elem)(x >> 16);
}
#endif

__device__ __forceinline__ ULL first_thread() { return (ULL)blockIdx.x * blockDim.x + threadIdx.x; }
__device__ __forceinline__ ULL thread_stride() { return (ULL)gridDim.x * blockDim.x; }
__device__ __forceinline__ ULL first_warp() { return first_thread() >> 5; }
__device__ __forceinline__ ULL warp_stride() { return thread_stride() >> 5; }
__device__ __forceinline__ ULL min_ull(ULL a, ULL b) { return a < b ? a : b; }
__device__ __forceinline__ float minus_infinity() { return __int_as_float(0xff800000); }

/* The reductions: a sum, and a maximum. */
struct Sum {
    __device__ __forceinline__ float operator()(float a, float b) const { return a + b; }
};
struct Max {
    __device__ __forceinline__ float operator()(float a, float b) const { return fmaxf(a, b); }
};

/* `op` over the warp's values of `v`, in every lane. */
template <typename Op>
__device__ __forceinline__ float warp_reduce(float v, Op op) {
    for (int offset = 16; offset > 0; offset >>= 1) v = op(v, __shfl_xor_sync(0xffffffffu, v, offset));
    return v;
}

/* `op` over the block of every thread's `v` (blocks of at most 1024 threads); `identity` fills
   the lanes past the block's last warp. */
template <typename Op>
__device__ float block_reduce(float v, float* shared, float identity, Op op) {
    int lane = threadIdx.x & 31;
    int warp = threadIdx.x >> 5;
    v = warp_reduce(v, op);
    __syncthreads();
    if (lane == 0) shared[warp] = v;
    __syncthreads();
    if (warp == 0) {
        float t = (lane < (int)((blockDim.x + 31) >> 5)) ? shared[lane] : identity;
        t = warp_reduce(t, op);
        if (lane == 0) shared[0] = t;
    }
    __syncthreads();
    float total = shared[0];
    __syncthreads();
    return total;
}

__device__ __forceinline__ float warp_sum(float v) { return warp_reduce(v, Sum()); }
__device__ float block_sum(float v, float* shared) { return block_reduce(v, shared, 0.0f, Sum()); }
__device__ float block_max(float v, float* shared) { return block_reduce(v, shared, minus_infinity(), Max()); }

/* Adds `v` to `*p` atomically; a 16-bit value through the aligned 32-bit word holding it. */
__device__ void add_elem(elem* p, float v) {
#if VP_DTYPE == 0
    atomicAdd(p, v);
#else
    unsigned int* word = (unsigned int*)((ULL)p & ~(ULL)3);
    unsigned int shift = ((ULL)p & 2) ? 16u : 0u;
    unsigned int old = *word;
    unsigned int assumed;
    do {
        assumed = old;
        elem current = (elem)((assumed >> shift) & 0xffffu);
        unsigned int updated = (unsigned int)st(ld(current) + v);
        unsigned int replaced = (assumed & ~(0xffffu << shift)) | (updated << shift);
        old = atomicCAS(word, assumed, replaced);
    } while (assumed != old);
#endif
}

__device__ float activation(float v, int mode) {
    if (mode == 0) return v / (1.0f + expf(-v));
    if (mode == 1) return 0.5f * v * (1.0f + erff(v * 0.70710678f));
    if (mode == 2) return 0.5f * v * (1.0f + tanhf(0.79788456f * (v + 0.044715f * v * v * v)));
    return fmaxf(v, 0.0f);
}

__device__ float activation_grad(float v, int mode) {
    if (mode == 0) {
        float s = 1.0f / (1.0f + expf(-v));
        return s * (1.0f + v * (1.0f - s));
    }
    if (mode == 1) return 0.5f * (1.0f + erff(v * 0.70710678f)) + v * 0.39894228f * expf(-0.5f * v * v);
    if (mode == 2) {
        float t = tanhf(0.79788456f * (v + 0.044715f * v * v * v));
        return 0.5f * (1.0f + t) + 0.5f * v * (1.0f - t * t) * 0.79788456f * (1.0f + 0.134145f * v * v);
    }
    return v > 0.0f ? 1.0f : 0.0f;
}

extern "C" __global__ void vp_embedding(const unsigned int* ids, const elem* table, elem* out, ULL rows, ULL vocab, ULL width) {
    ULL n = rows * width;
    for (ULL i = first_thread(); i < n; i += thread_stride()) {
        ULL row = i / width;
        ULL column = i - row * width;
        ULL id = (ULL)ids[row] % vocab;
        out[i] = table[id * width + column];
    }
}

extern "C" __global__ void vp_embedding_backward(const unsigned int* ids, const elem* dout, elem* dtable, ULL rows, ULL vocab, ULL width) {
    ULL n = rows * width;
    for (ULL i = first_thread(); i < n; i += thread_stride()) {
        ULL row = i / width;
        ULL column = i - row * width;
        ULL id = (ULL)ids[row] % vocab;
        add_elem(dtable + id * width + column, ld(dout[i]));
    }
}

extern "C" __global__ void vp_rms_norm(const elem* x, const elem* w, elem* y, ULL rows, ULL width, float eps) {
    __shared__ float shared[32];
    for (ULL row = blockIdx.x; row < rows; row += gridDim.x) {
        const elem* xr = x + row * width;
        elem* yr = y + row * width;
        float s = 0.0f;
        for (ULL c = threadIdx.x; c < width; c += blockDim.x) { float v = ld(xr[c]); s += v * v; }
        float inv = rsqrtf(block_sum(s, shared) / (float)width + eps);
        for (ULL c = threadIdx.x; c < width; c += blockDim.x) yr[c] = st(ld(xr[c]) * inv * ld(w[c]));
    }
}

extern "C" __global__ void vp_layer_norm(const elem* x, const elem* w, const elem* b, elem* y, ULL rows, ULL width, float eps, int has_bias) {
    __shared__ float shared[32];
    for (ULL row = blockIdx.x; row < rows; row += gridDim.x) {
        const elem* xr = x + row * width;
        elem* yr = y + row * width;
        float s = 0.0f;
        for (ULL c = threadIdx.x; c < width; c += blockDim.x) s += ld(xr[c]);
        float mean = block_sum(s, shared) / (float)width;
        float q = 0.0f;
        for (ULL c = threadIdx.x; c < width; c += blockDim.x) { float d = ld(xr[c]) - mean; q += d * d; }
        float inv = rsqrtf(block_sum(q, shared) / (float)width + eps);
        for (ULL c = threadIdx.x; c < width; c += blockDim.x) {
            float v = (ld(xr[c]) - mean) * inv * ld(w[c]);
            yr[c] = st(has_bias ? v + ld(b[c]) : v);
        }
    }
}

extern "C" __global__ void vp_norm_backward(const elem* x, const elem* w, const elem* dy, elem* dx, ULL rows, ULL width, float eps, int rms) {
    __shared__ float shared[32];
    for (ULL row = blockIdx.x; row < rows; row += gridDim.x) {
        const elem* xr = x + row * width;
        const elem* dyr = dy + row * width;
        elem* dxr = dx + row * width;
        float s = 0.0f;
        for (ULL c = threadIdx.x; c < width; c += blockDim.x) s += ld(xr[c]);
        float mean = rms ? 0.0f : block_sum(s, shared) / (float)width;
        float q = 0.0f;
        for (ULL c = threadIdx.x; c < width; c += blockDim.x) { float d = ld(xr[c]) - mean; q += d * d; }
        float inv = rsqrtf(block_sum(q, shared) / (float)width + eps);
        float g_sum = 0.0f;
        float gx_sum = 0.0f;
        for (ULL c = threadIdx.x; c < width; c += blockDim.x) {
            float g = ld(dyr[c]) * ld(w[c]);
            g_sum += g;
            gx_sum += g * (ld(xr[c]) - mean) * inv;
        }
        float g_mean = rms ? 0.0f : block_sum(g_sum, shared) / (float)width;
        float gx_mean = block_sum(gx_sum, shared) / (float)width;
        for (ULL c = threadIdx.x; c < width; c += blockDim.x) {
            float xhat = (ld(xr[c]) - mean) * inv;
            dxr[c] = st(inv * (ld(dyr[c]) * ld(w[c]) - g_mean - xhat * gx_mean));
        }
    }
}

extern "C" __global__ void vp_column_sum(const elem* a, const elem* b, elem* out, ULL rows, ULL cols, int has_b) {
    for (ULL c = first_thread(); c < cols; c += thread_stride()) {
        float s = 0.0f;
        for (ULL r = 0; r < rows; ++r) s += ld(a[r * cols + c]) * (has_b ? ld(b[r * cols + c]) : 1.0f);
        out[c] = st(s);
    }
}

extern "C" __global__ void vp_bias_add(elem* y, const elem* bias, ULL rows, ULL cols) {
    ULL n = rows * cols;
    for (ULL i = first_thread(); i < n; i += thread_stride()) y[i] = st(ld(y[i]) + ld(bias[i % cols]));
}

extern "C" __global__ void vp_act(const elem* x, elem* y, ULL rows, ULL width, int mode) {
    ULL n = rows * width;
    for (ULL i = first_thread(); i < n; i += thread_stride()) y[i] = st(activation(ld(x[i]), mode));
}

extern "C" __global__ void vp_act_mul(const elem* gate, const elem* up, elem* y, ULL rows, ULL width, int mode) {
    ULL n = rows * width;
    for (ULL i = first_thread(); i < n; i += thread_stride()) y[i] = st(activation(ld(gate[i]), mode) * ld(up[i]));
}

extern "C" __global__ void vp_act_backward(const elem* x, const elem* dy, elem* dx, ULL rows, ULL width, int mode) {
    ULL n = rows * width;
    for (ULL i = first_thread(); i < n; i += thread_stride()) dx[i] = st(ld(dy[i]) * activation_grad(ld(x[i]), mode));
}

extern "C" __global__ void vp_act_mul_backward(const elem* gate, const elem* up, const elem* dy, elem* dgate, elem* dup, ULL rows, ULL width, int mode) {
    ULL n = rows * width;
    for (ULL i = first_thread(); i < n; i += thread_stride()) {
        float g = ld(gate[i]);
        float d = ld(dy[i]);
        dgate[i] = st(d * ld(up[i]) * activation_grad(g, mode));
        dup[i] = st(d * activation(g, mode));
    }
}

/* rotate_half's layout: the pair (p, p + rot_dim / 2) of each head turns by position · θ^(−2p/rot_dim). */
extern "C" __global__ void vp_rotary(elem* x, ULL rows, ULL head_dim, ULL heads, ULL seq, ULL rot_dim, float theta, float sign) {
    ULL half = min_ull(rot_dim, head_dim) / 2;
    ULL n = rows * half;
    for (ULL i = first_thread(); i < n; i += thread_stride()) {
        ULL row = i / half;
        ULL pair = i - row * half;
        ULL position = (row / heads) % seq;
        float frequency = powf(theta, -2.0f * (float)pair / (float)(2 * half));
        float angle = sign * (float)position * frequency;
        float c = cosf(angle);
        float s = sinf(angle);
        elem* xr = x + row * head_dim;
        float a = ld(xr[pair]);
        float b = ld(xr[pair + half]);
        xr[pair] = st(a * c - b * s);
        xr[pair + half] = st(b * c + a * s);
    }
}

/* Keys are aligned to the end of the queries: query i of seq_q sees key j when j <= i + cols - seq_q. */
extern "C" __global__ void vp_softmax(elem* x, ULL rows, ULL cols, int causal, ULL seq_q, float scale) {
    __shared__ float shared[32];
    for (ULL row = blockIdx.x; row < rows; row += gridDim.x) {
        elem* xr = x + row * cols;
        ULL query = row % seq_q;
        ULL visible = causal ? min_ull(cols, query + 1 + (cols > seq_q ? cols - seq_q : 0)) : cols;
        float m = minus_infinity();
        for (ULL c = threadIdx.x; c < visible; c += blockDim.x) m = fmaxf(m, ld(xr[c]) * scale);
        m = block_max(m, shared);
        float s = 0.0f;
        for (ULL c = threadIdx.x; c < visible; c += blockDim.x) s += expf(ld(xr[c]) * scale - m);
        float total = block_sum(s, shared);
        for (ULL c = threadIdx.x; c < cols; c += blockDim.x)
            xr[c] = st(c < visible ? expf(ld(xr[c]) * scale - m) / total : 0.0f);
    }
}

extern "C" __global__ void vp_softmax_backward(const elem* y, elem* dy, ULL rows, ULL cols) {
    __shared__ float shared[32];
    for (ULL row = blockIdx.x; row < rows; row += gridDim.x) {
        const elem* yr = y + row * cols;
        elem* dr = dy + row * cols;
        float s = 0.0f;
        for (ULL c = threadIdx.x; c < cols; c += blockDim.x) s += ld(yr[c]) * ld(dr[c]);
        float dot = block_sum(s, shared);
        for (ULL c = threadIdx.x; c < cols; c += blockDim.x) dr[c] = st(ld(yr[c]) * (ld(dr[c]) - dot));
    }
}

/* The keys query row r (of groups × per_group × seq_q) sees: all, or up to its position. */
__device__ __forceinline__ ULL visible_keys(ULL r, ULL seq_q, ULL seq_k, int causal) {
    ULL query = r % seq_q;
    return causal ? min_ull(seq_k, query + 1 + (seq_k > seq_q ? seq_k - seq_q : 0)) : seq_k;
}

__device__ __forceinline__ float dot(const elem* a, const elem* b, ULL n, int lane) {
    float s = 0.0f;
    for (ULL d = lane; d < n; d += 32) s += ld(a[d]) * ld(b[d]);
    return warp_sum(s);
}

/* Memory-efficient attention: one warp per query row, an online softmax over the keys (no
   scores kept), the output in chunks of 256 values, and the row's log-sum-exp for backward. */
extern "C" __global__ void vp_attention(const elem* q, const elem* k, const elem* v, elem* o, float* lse,
        ULL groups, ULL per_group, ULL seq_q, ULL seq_k, ULL d_qk, ULL d_v, int causal, float scale) {
    int lane = threadIdx.x & 31;
    ULL rows = groups * per_group * seq_q;
    for (ULL r = first_warp(); r < rows; r += warp_stride()) {
        ULL g = r / (per_group * seq_q);
        const elem* qr = q + r * d_qk;
        const elem* kg = k + g * seq_k * d_qk;
        const elem* vg = v + g * seq_k * d_v;
        ULL keys = visible_keys(r, seq_q, seq_k, causal);
        for (ULL chunk = 0; chunk < d_v; chunk += 256) {
            float acc[8];
            for (int t = 0; t < 8; ++t) acc[t] = 0.0f;
            float m = minus_infinity();
            float l = 0.0f;
            for (ULL j = 0; j < keys; ++j) {
                float s = dot(qr, kg + j * d_qk, d_qk, lane) * scale;
                float m_new = fmaxf(m, s);
                float old_scale = expf(m - m_new);
                float p = expf(s - m_new);
                l = l * old_scale + p;
                for (int t = 0; t < 8; ++t) {
                    ULL d = chunk + lane + 32 * t;
                    if (d < d_v) acc[t] = acc[t] * old_scale + p * ld(vg[j * d_v + d]);
                }
                m = m_new;
            }
            for (int t = 0; t < 8; ++t) {
                ULL d = chunk + lane + 32 * t;
                if (d < d_v) o[r * d_v + d] = st(l > 0.0f ? acc[t] / l : 0.0f);
            }
            if (chunk == 0 && lane == 0) lse[r] = m + logf(l);
        }
    }
}

/* dQ of memory-efficient attention: per query row, p recomputed from the log-sum-exp,
   dS = p · (dP − rowsum(dO · O)), dQ = dS · K · scale. */
extern "C" __global__ void vp_attention_backward_q(const elem* q, const elem* k, const elem* v, const elem* o,
        const elem* d_o, const float* lse, elem* dq,
        ULL groups, ULL per_group, ULL seq_q, ULL seq_k, ULL d_qk, ULL d_v, int causal, float scale) {
    int lane = threadIdx.x & 31;
    ULL rows = groups * per_group * seq_q;
    for (ULL r = first_warp(); r < rows; r += warp_stride()) {
        ULL g = r / (per_group * seq_q);
        const elem* qr = q + r * d_qk;
        const elem* kg = k + g * seq_k * d_qk;
        const elem* vg = v + g * seq_k * d_v;
        const elem* dor = d_o + r * d_v;
        float row_dot = dot(dor, o + r * d_v, d_v, lane);
        ULL keys = visible_keys(r, seq_q, seq_k, causal);
        for (ULL chunk = 0; chunk < d_qk; chunk += 256) {
            float acc[8];
            for (int t = 0; t < 8; ++t) acc[t] = 0.0f;
            for (ULL j = 0; j < keys; ++j) {
                float p = expf(dot(qr, kg + j * d_qk, d_qk, lane) * scale - lse[r]);
                float ds = p * (dot(dor, vg + j * d_v, d_v, lane) - row_dot);
                for (int t = 0; t < 8; ++t) {
                    ULL d = chunk + lane + 32 * t;
                    if (d < d_qk) acc[t] += ds * ld(kg[j * d_qk + d]) * scale;
                }
            }
            for (int t = 0; t < 8; ++t) {
                ULL d = chunk + lane + 32 * t;
                if (d < d_qk) dq[r * d_qk + d] = st(acc[t]);
            }
        }
    }
}

/* dK and dV of memory-efficient attention: one warp per key row, over the query rows of its
   group that see it. */
extern "C" __global__ void vp_attention_backward_kv(const elem* q, const elem* k, const elem* v, const elem* o,
        const elem* d_o, const float* lse, elem* dk, elem* dv,
        ULL groups, ULL per_group, ULL seq_q, ULL seq_k, ULL d_qk, ULL d_v, int causal, float scale) {
    int lane = threadIdx.x & 31;
    ULL key_rows = groups * seq_k;
    ULL width = d_qk > d_v ? d_qk : d_v;
    ULL shift = seq_k > seq_q ? seq_k - seq_q : 0;
    for (ULL kr = first_warp(); kr < key_rows; kr += warp_stride()) {
        ULL g = kr / seq_k;
        ULL j = kr - g * seq_k;
        const elem* kj = k + kr * d_qk;
        const elem* vj = v + kr * d_v;
        for (ULL chunk = 0; chunk < width; chunk += 256) {
            float acc_k[8];
            float acc_v[8];
            for (int t = 0; t < 8; ++t) { acc_k[t] = 0.0f; acc_v[t] = 0.0f; }
            for (ULL i = 0; i < per_group * seq_q; ++i) {
                ULL r = g * per_group * seq_q + i;
                if (causal && j > (i % seq_q) + shift) continue;
                const elem* qr = q + r * d_qk;
                const elem* dor = d_o + r * d_v;
                float p = expf(dot(qr, kj, d_qk, lane) * scale - lse[r]);
                float ds = p * (dot(dor, vj, d_v, lane) - dot(dor, o + r * d_v, d_v, lane));
                for (int t = 0; t < 8; ++t) {
                    ULL d = chunk + lane + 32 * t;
                    if (d < d_qk) acc_k[t] += ds * ld(qr[d]) * scale;
                    if (d < d_v) acc_v[t] += p * ld(dor[d]);
                }
            }
            for (int t = 0; t < 8; ++t) {
                ULL d = chunk + lane + 32 * t;
                if (d < d_qk) dk[kr * d_qk + d] = st(acc_k[t]);
                if (d < d_v) dv[kr * d_v + d] = st(acc_v[t]);
            }
        }
    }
}

/* Top-k routing: per token, the softmax over the experts, the k largest and their weights. */
extern "C" __global__ void vp_moe_topk(const elem* logits, unsigned int* indices, elem* weights, ULL rows, ULL experts, ULL k) {
    for (ULL row = first_thread(); row < rows; row += thread_stride()) {
        const elem* lr = logits + row * experts;
        float m = minus_infinity();
        for (ULL e = 0; e < experts; ++e) m = fmaxf(m, ld(lr[e]));
        float total = 0.0f;
        for (ULL e = 0; e < experts; ++e) total += expf(ld(lr[e]) - m);
        for (ULL t = 0; t < k; ++t) {
            ULL best = 0;
            float best_value = minus_infinity();
            for (ULL e = 0; e < experts; ++e) {
                int taken = 0;
                for (ULL u = 0; u < t; ++u) taken |= indices[row * k + u] == (unsigned int)e;
                float value = ld(lr[e]);
                if (!taken && value > best_value) { best = e; best_value = value; }
            }
            indices[row * k + t] = (unsigned int)best;
            weights[row * k + t] = st(expf(ld(lr[best]) - m) / total);
        }
    }
}

extern "C" __global__ void vp_cross_entropy(const elem* logits, const unsigned int* labels, float* loss, ULL rows, ULL vocab) {
    __shared__ float shared[32];
    for (ULL row = blockIdx.x; row < rows; row += gridDim.x) {
        const elem* lr = logits + row * vocab;
        float m = minus_infinity();
        for (ULL c = threadIdx.x; c < vocab; c += blockDim.x) m = fmaxf(m, ld(lr[c]));
        m = block_max(m, shared);
        float s = 0.0f;
        for (ULL c = threadIdx.x; c < vocab; c += blockDim.x) s += expf(ld(lr[c]) - m);
        float total = block_sum(s, shared);
        if (threadIdx.x == 0) loss[row] = logf(total) + m - ld(lr[(ULL)labels[row] % vocab]);
    }
}

extern "C" __global__ void vp_cross_entropy_backward(const elem* logits, const unsigned int* labels, elem* dlogits, ULL rows, ULL vocab) {
    __shared__ float shared[32];
    for (ULL row = blockIdx.x; row < rows; row += gridDim.x) {
        const elem* lr = logits + row * vocab;
        elem* dr = dlogits + row * vocab;
        float m = minus_infinity();
        for (ULL c = threadIdx.x; c < vocab; c += blockDim.x) m = fmaxf(m, ld(lr[c]));
        m = block_max(m, shared);
        float s = 0.0f;
        for (ULL c = threadIdx.x; c < vocab; c += blockDim.x) s += expf(ld(lr[c]) - m);
        float total = block_sum(s, shared);
        ULL label = (ULL)labels[row] % vocab;
        for (ULL c = threadIdx.x; c < vocab; c += blockDim.x)
            dr[c] = st(expf(ld(lr[c]) - m) / total - (c == label ? 1.0f : 0.0f));
    }
}

extern "C" __global__ void vp_adamw(elem* param, const elem* grad, elem* exp_avg, elem* exp_avg_sq, ULL n,
        float lr, float beta1, float beta2, float eps, float weight_decay, int step) {
    float correction1 = 1.0f - powf(beta1, (float)step);
    float correction2 = 1.0f - powf(beta2, (float)step);
    for (ULL i = first_thread(); i < n; i += thread_stride()) {
        float g = ld(grad[i]);
        float m = beta1 * ld(exp_avg[i]) + (1.0f - beta1) * g;
        float v = beta2 * ld(exp_avg_sq[i]) + (1.0f - beta2) * g * g;
        exp_avg[i] = st(m);
        exp_avg_sq[i] = st(v);
        float p = ld(param[i]) * (1.0f - lr * weight_decay);
        param[i] = st(p - lr * (m / correction1) / (sqrtf(v / correction2) + eps));
    }
}

extern "C" __global__ void vp_sgd(elem* param, const elem* grad, ULL n, float lr) {
    for (ULL i = first_thread(); i < n; i += thread_stride()) param[i] = st(ld(param[i]) - lr * ld(grad[i]));
}

extern "C" __global__ void vp_sgd_momentum(elem* param, const elem* grad, elem* buffer, ULL n, float lr, float momentum) {
    for (ULL i = first_thread(); i < n; i += thread_stride()) {
        float b = momentum * ld(buffer[i]) + ld(grad[i]);
        buffer[i] = st(b);
        param[i] = st(ld(param[i]) - lr * b);
    }
}
