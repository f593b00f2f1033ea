//! The CUDA backend (feature `cuda`): the forward pass and the output head on a GPU, with
//! the CPU backend's numbers.
//!
//! - **Loading.** cudarc loads `libcuda` and `libnvrtc` at run time; [`unavailable`] checks
//!   that they are present (cudarc panics on a missing library) and that a device exists
//!   before any context is created. The kernels (`kernels.cu`) are compiled with NVRTC for
//!   the device's compute capability when the model is loaded: no nvcc at build time.
//! - **The numeric contract.** The program is compiled with `--fmad=false` and IEEE division
//!   and square root: each kernel performs the CPU kernel's f32 operations in the CPU
//!   kernel's order (see the comments in `kernels.cu`). The GEMM's output element is one
//!   `fmaf` chain over k in order, from zero; no split-K, no atomics, no TF32; rows never
//!   interact. Embedding rows and RoPE tables are computed on the host by the CPU code, and
//!   log-softmax and top-k run on the host over the logits the GPU hands back. So a GPU
//!   row is bit for bit the CPU's row, whatever the batch and whichever GEMM kernel ran it
//!   (`launch::GemmKind`) — as `scripts/gpu-check.sh` found on an H200; nothing here can
//!   run without a device.
//! - **Weights** are the CPU backend's packed panels (`kernels::gemm`), copied as they are:
//!   4-bit types stay 4 bits per weight plus an f32 scale and offset per group of 32
//!   (0.75 bytes per parameter), 8-bit ones 1 byte plus the same, float types f32. The
//!   kernels dequantize as the CPU does (`q * scale + offset`, multiply then add).
//! - **KV cache.** Each sequence's keys and values live on the device in its
//!   [`crate::kv::KvCache`] ([`DevCache`]), rows `[pos][n_head_kv * head_dim]`, grown by
//!   doubling.

mod launch;

use std::sync::Arc;

use cudarc::driver::{CudaContext, CudaSlice, CudaStream, DevicePtr};

use crate::device::GemmTiming;
use crate::error::{EngineError, Result};
use crate::forward::{BatchItem, batch_rows, embeddings, rope_tables};
use crate::kernels::Linear;
use crate::kernels::gemm::Parts;
use crate::model::Weights;
use crate::profile::requant::KvDtype;

use launch::{Arg, Funcs, GemmKind, GemmShape};

pub(crate) use launch::compile;

/// A device error in the engine's terms.
fn dev_err(what: &str, e: impl std::fmt::Display) -> EngineError {
    EngineError::Device(format!("{what}: {e}"))
}

/// Why CUDA cannot be used here, or None when it can: the driver and NVRTC libraries load
/// and the driver reports at least one device. Creates no context; never panics.
pub(crate) fn unavailable() -> Option<String> {
    // SAFETY: these only try to open the shared libraries by name.
    if !unsafe { cudarc::driver::sys::is_culib_present() } {
        return Some("the CUDA driver library (libcuda.so) is not installed".into());
    }
    // SAFETY: as above.
    if !unsafe { cudarc::nvrtc::sys::is_culib_present() } {
        return Some("NVRTC (libnvrtc.so) is not installed or not on LD_LIBRARY_PATH".into());
    }
    match CudaContext::device_count() {
        Ok(0) => Some("the CUDA driver reports no device".into()),
        Ok(_) => None,
        Err(e) => Some(format!("the CUDA driver cannot start: {e}")),
    }
}

/// A weight matrix on the device, in the CPU's panel layout.
struct DevLinear {
    n: usize,
    k: usize,
    /// f32 weights, or the integers (i8 or nibble bytes).
    data: CudaSlice<u8>,
    /// 0 f32, 1 eight-bit, 2 four-bit.
    fmt: u8,
    lo: i32,
    group: i32,
    scale: Option<CudaSlice<f32>>,
    offset: Option<CudaSlice<f32>>,
}

impl DevLinear {
    fn shape(&self) -> GemmShape {
        GemmShape {
            n: self.n,
            k: self.k,
            fmt: self.fmt,
            group: usize::try_from(self.group).unwrap_or(0),
        }
    }
}

/// One decoder layer on the device.
struct DevLayer {
    attn_norm: CudaSlice<f32>,
    qkv: DevLinear,
    qkv_bias: Option<CudaSlice<f32>>,
    qk_norm: Option<(CudaSlice<f32>, CudaSlice<f32>)>,
    wo: DevLinear,
    ffn_norm: CudaSlice<f32>,
    gate_up: DevLinear,
    down: DevLinear,
}

/// The model on a GPU.
pub(crate) struct CudaModel {
    stream: Arc<CudaStream>,
    f: Funcs,
    layers: Vec<DevLayer>,
    head: DevLinear,
    output_norm: CudaSlice<f32>,
    /// "cuda:N (name, compute capability X.Y)".
    label: String,
    bytes: usize,
    /// `SAMEWISE_CUDA_GEMM`'s kernel, if it forces one.
    gemm_forced: Option<GemmKind>,
    /// The device's multiprocessors.
    sms: usize,
}

impl std::fmt::Debug for CudaModel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CudaModel")
            .field("device", &self.label)
            .field("bytes", &self.bytes)
            .finish_non_exhaustive()
    }
}

/// A sequence's KV cache on the device: per layer, keys and values as rows `[pos][kvd]`.
pub(crate) struct DevCache {
    k: Vec<CudaSlice<f32>>,
    v: Vec<CudaSlice<f32>>,
    /// Positions the buffers hold.
    cap: usize,
}

impl std::fmt::Debug for DevCache {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DevCache")
            .field("layers", &self.k.len())
            .field("cap", &self.cap)
            .finish()
    }
}

/// The final-normed hidden states of a forward pass, on the device, `[m][n_embd]`.
pub(crate) struct DevHidden {
    h: CudaSlice<f32>,
}

fn ptr<T>(s: &CudaSlice<T>, stream: &Arc<CudaStream>) -> u64 {
    let (p, _sync) = s.device_ptr(stream);
    p
}

fn opt_ptr<T>(s: Option<&CudaSlice<T>>, stream: &Arc<CudaStream>) -> u64 {
    s.map_or(0, |s| ptr(s, stream))
}

impl CudaModel {
    /// Copies `w` to GPU `ordinal` and compiles the kernels for it.
    pub(crate) fn load(w: &Weights, ordinal: usize) -> Result<Self> {
        let gemm_forced = GemmKind::from_env()?;
        if let Some(why) = unavailable() {
            return Err(EngineError::Device(why));
        }
        let count = CudaContext::device_count().map_err(|e| dev_err("device count", e))?;
        if ordinal >= usize::try_from(count).unwrap_or(0) {
            return Err(EngineError::Device(format!(
                "no CUDA device {ordinal}: the driver reports {count}"
            )));
        }
        let ctx = CudaContext::new(ordinal).map_err(|e| dev_err("cannot create a context", e))?;
        // one stream, so cudarc's cross-stream event tracking is not needed
        // SAFETY: every buffer is used on the one stream created below.
        unsafe { ctx.disable_event_tracking() };
        let (major, minor) = ctx
            .compute_capability()
            .map_err(|e| dev_err("compute capability", e))?;
        let name = ctx.name().unwrap_or_else(|_| "unknown GPU".into());
        let sms = ctx
            .attribute(
                cudarc::driver::sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT,
            )
            .map_err(|e| dev_err("multiprocessor count", e))?;
        let sms = usize::try_from(sms).unwrap_or(1).max(1);
        let stream = ctx.default_stream();
        let ptx = compile(major, minor)?;
        let module = ctx
            .load_module(ptx)
            .map_err(|e| dev_err("cannot load the compiled kernels", e))?;
        let f = Funcs::load(&module)?;
        let mut bytes = 0usize;
        let mut up = |lin: &Linear| -> Result<DevLinear> {
            let d = upload_linear(&stream, lin)?;
            bytes += d.data.len()
                + 4 * (d.scale.as_ref().map_or(0, CudaSlice::len)
                    + d.offset.as_ref().map_or(0, CudaSlice::len));
            Ok(d)
        };
        let mut layers = Vec::with_capacity(w.layers.len());
        for l in &w.layers {
            layers.push(DevLayer {
                attn_norm: htod(&stream, &l.attn_norm)?,
                qkv: up(&l.qkv)?,
                qkv_bias: l
                    .qkv_bias
                    .as_deref()
                    .map(|b| htod(&stream, b))
                    .transpose()?,
                qk_norm: match &l.qk_norm {
                    Some((q, k)) => Some((htod(&stream, q)?, htod(&stream, k)?)),
                    None => None,
                },
                wo: up(&l.wo)?,
                ffn_norm: htod(&stream, &l.ffn_norm)?,
                gate_up: up(&l.gate_up)?,
                down: up(&l.down)?,
            });
        }
        let head = up(w.head())?;
        let output_norm = htod(&stream, &w.output_norm)?;
        stream
            .synchronize()
            .map_err(|e| dev_err("copying the weights", e))?;
        Ok(Self {
            stream,
            f,
            layers,
            head,
            output_norm,
            label: format!("cuda:{ordinal} ({name}, compute capability {major}.{minor})"),
            bytes,
            gemm_forced,
            sms,
        })
    }

    /// Which device, in words.
    pub(crate) fn label(&self) -> &str {
        &self.label
    }

    /// Bytes of weights held on the device.
    pub(crate) fn bytes(&self) -> usize {
        self.bytes
    }

    /// The forward pass of `items` (as [`crate::forward::forward`]), the caches on the device.
    pub(crate) fn forward(&self, w: &Weights, items: &mut [BatchItem<'_>]) -> Result<DevHidden> {
        let c = &w.config;
        let s = &self.stream;
        let rows = batch_rows(c, items)?;
        let m = rows.len();
        let (e, hd, nh, nkv) = (c.n_embd, c.head_dim, c.n_head, c.n_head_kv);
        let (qd, kvd, qkvd, ff) = (nh * hd, nkv * hd, c.qkv_dim(), c.n_ff);
        if m == 0 {
            return Ok(DevHidden { h: alloc(s, 1)? });
        }
        // each sequence's cache must hold its new positions
        for it in items.iter_mut() {
            let need = it.cache.len + it.tokens.len();
            self.reserve(&mut it.cache.dev, c.n_layer, kvd, need)?;
        }
        let mut x = htod(s, &embeddings(w, items, m))?;
        let (cos, sin) = rope_tables(w, &rows);
        let (cos, sin) = (htod(s, &cos)?, htod(s, &sin)?);
        let pos: Vec<i32> = rows
            .iter()
            .map(|&(_, p)| to_i32(p))
            .collect::<Result<_>>()?;
        let pos_d = htod(s, &pos)?;
        let max_keys = rows.iter().map(|&(_, p)| p + 1).max().unwrap_or(1);
        let mut h = alloc(s, m * e)?;
        let mut qkv = alloc(s, m * qkvd)?;
        let mut att = alloc(s, m * qd)?;
        let mut o = alloc(s, m * e)?;
        let mut gu = alloc(s, m * 2 * ff)?;
        let mut act = alloc(s, m * ff)?;
        let scores = alloc(s, m * nh * max_keys)?;
        let kv_code = match w.numerics.kv {
            KvDtype::F32 => 0,
            KvDtype::F16 => 1,
            KvDtype::Bf16 => 2,
            KvDtype::Q8 => 3,
        };
        let a8 = w.numerics.activations_q8;
        let hd32 = to_i32(hd)?;
        for (li, l) in self.layers.iter().enumerate() {
            // per row: its sequence's key and value buffers for this layer
            let mut kp = Vec::with_capacity(m);
            let mut vp = Vec::with_capacity(m);
            for &(item, _) in &rows {
                let dc =
                    items[item].cache.dev.as_ref().ok_or_else(|| {
                        EngineError::Device("a sequence has no device cache".into())
                    })?;
                kp.push(ptr(&dc.k[li], s));
                vp.push(ptr(&dc.v[li], s));
            }
            let (kp, vp) = (htod(s, &kp)?, htod(s, &vp)?);
            self.rms_norm(&x, &l.attn_norm, &mut h, m, e, c.rms_eps)?;
            if a8 {
                self.quantize_rows(&mut h, m, e)?;
            }
            self.gemm(&l.qkv, &h, m, &mut qkv)?;
            let (qn, kn) = match &l.qk_norm {
                Some((q, k)) => (ptr(q, s), ptr(k, s)),
                None => (0, 0),
            };
            self.f.launch(
                s,
                &self.f.qkv_post,
                (m, nh + 2 * nkv, 1),
                (hd.clamp(32, 256), 1, 1),
                4 * hd,
                &[
                    Arg::P(ptr(&qkv, s)),
                    Arg::I(to_i32(qkvd)?),
                    Arg::P(opt_ptr(l.qkv_bias.as_ref(), s)),
                    Arg::P(qn),
                    Arg::P(kn),
                    Arg::P(ptr(&cos, s)),
                    Arg::P(ptr(&sin, s)),
                    Arg::I(to_i32(nh)?),
                    Arg::I(to_i32(nkv)?),
                    Arg::I(hd32),
                    Arg::F(c.rms_eps),
                    Arg::I(kv_code),
                ],
            )?;
            self.f.launch(
                s,
                &self.f.kv_store,
                (m, 1, 1),
                (128, 1, 1),
                0,
                &[
                    Arg::P(ptr(&qkv, s)),
                    Arg::I(to_i32(qkvd)?),
                    Arg::I(to_i32(qd)?),
                    Arg::I(to_i32(kvd)?),
                    Arg::P(ptr(&kp, s)),
                    Arg::P(ptr(&vp, s)),
                    Arg::P(ptr(&pos_d, s)),
                ],
            )?;
            self.f.launch(
                s,
                &self.f.attention,
                (m, nh, 1),
                (128, 1, 1),
                4 * hd,
                &[
                    Arg::P(ptr(&qkv, s)),
                    Arg::I(to_i32(qkvd)?),
                    Arg::P(ptr(&att, s)),
                    Arg::I(to_i32(qd)?),
                    Arg::P(ptr(&kp, s)),
                    Arg::P(ptr(&vp, s)),
                    Arg::P(ptr(&pos_d, s)),
                    Arg::I(to_i32(nh)?),
                    Arg::I(to_i32(nh / nkv)?),
                    Arg::I(hd32),
                    Arg::I(to_i32(kvd)?),
                    Arg::F(1.0 / (hd as f32).sqrt()),
                    Arg::P(ptr(&scores, s)),
                    Arg::L(max_keys as i64),
                ],
            )?;
            if a8 {
                self.quantize_rows(&mut att, m, qd)?;
            }
            self.gemm(&l.wo, &att, m, &mut o)?;
            self.add(&mut x, &o, m * e)?;
            self.rms_norm(&x, &l.ffn_norm, &mut h, m, e, c.rms_eps)?;
            if a8 {
                self.quantize_rows(&mut h, m, e)?;
            }
            self.gemm(&l.gate_up, &h, m, &mut gu)?;
            self.f.launch(
                s,
                &self.f.silu_mul,
                ((m * ff).div_ceil(256), 1, 1),
                (256, 1, 1),
                0,
                &[
                    Arg::P(ptr(&gu, s)),
                    Arg::P(ptr(&act, s)),
                    Arg::I(to_i32(ff)?),
                    Arg::L((m * ff) as i64),
                ],
            )?;
            if a8 {
                self.quantize_rows(&mut act, m, ff)?;
            }
            self.gemm(&l.down, &act, m, &mut o)?;
            self.add(&mut x, &o, m * e)?;
        }
        self.rms_norm(&x, &self.output_norm, &mut h, m, e, c.rms_eps)?;
        for it in items.iter_mut() {
            it.cache.len += it.tokens.len();
        }
        Ok(DevHidden { h })
    }

    /// The output head's logits of `rows` of `hidden` (`[rows.len()][vocab]`, into `out`),
    /// with the profile's activation knob applied to the head's input as on the CPU.
    pub(crate) fn logits(
        &self,
        w: &Weights,
        hidden: &DevHidden,
        rows: &[usize],
        out: &mut [f32],
    ) -> Result<()> {
        let s = &self.stream;
        let (e, v) = (w.config.n_embd, w.config.vocab_size);
        let j = rows.len();
        if j == 0 {
            return Ok(());
        }
        let idx: Vec<i32> = rows.iter().map(|&r| to_i32(r)).collect::<Result<_>>()?;
        let idx = htod(s, &idx)?;
        let mut x = alloc(s, j * e)?;
        self.f.launch(
            s,
            &self.f.gather_rows,
            (j, 1, 1),
            (256, 1, 1),
            0,
            &[
                Arg::P(ptr(&hidden.h, s)),
                Arg::P(ptr(&x, s)),
                Arg::P(ptr(&idx, s)),
                Arg::I(to_i32(e)?),
            ],
        )?;
        if w.numerics.activations_q8 {
            self.quantize_rows(&mut x, j, e)?;
        }
        let mut y = alloc(s, j * v)?;
        self.gemm(&self.head, &x, j, &mut y)?;
        s.memcpy_dtoh(&y, &mut out[..j * v])
            .map_err(|e| dev_err("copying logits back", e))?;
        s.synchronize().map_err(|e| dev_err("the forward pass", e))
    }

    /// Makes `cache` hold at least `need` positions per layer (doubling, old rows kept).
    fn reserve(
        &self,
        cache: &mut Option<DevCache>,
        n_layer: usize,
        kvd: usize,
        need: usize,
    ) -> Result<()> {
        let s = &self.stream;
        let cap = cache.as_ref().map_or(0, |c| c.cap);
        if need <= cap {
            return Ok(());
        }
        let new_cap = need.max(cap * 2).max(64);
        let mut k = Vec::with_capacity(n_layer);
        let mut v = Vec::with_capacity(n_layer);
        for li in 0..n_layer {
            let mut nk = alloc(s, new_cap * kvd)?;
            let mut nv = alloc(s, new_cap * kvd)?;
            if let Some(old) = cache.as_ref() {
                let used = old.cap * kvd;
                s.memcpy_dtod(&old.k[li], &mut nk.slice_mut(..used))
                    .map_err(|e| dev_err("growing a KV cache", e))?;
                s.memcpy_dtod(&old.v[li], &mut nv.slice_mut(..used))
                    .map_err(|e| dev_err("growing a KV cache", e))?;
            }
            k.push(nk);
            v.push(nv);
        }
        *cache = Some(DevCache { k, v, cap: new_cap });
        Ok(())
    }

    fn gemm(
        &self,
        w: &DevLinear,
        x: &CudaSlice<f32>,
        m: usize,
        y: &mut CudaSlice<f32>,
    ) -> Result<()> {
        let kind = GemmKind::choose(self.gemm_forced, m, w.shape(), self.sms);
        self.gemm_as(kind, w, x, m, y)
    }

    fn gemm_as(
        &self,
        kind: GemmKind,
        w: &DevLinear,
        x: &CudaSlice<f32>,
        m: usize,
        y: &mut CudaSlice<f32>,
    ) -> Result<()> {
        let s = &self.stream;
        let (rows, cols) = kind.block_tile();
        let grid = (w.n.div_ceil(cols), m.div_ceil(rows), 1);
        let mut args = vec![
            Arg::P(ptr(x, s)),
            Arg::P(ptr(y, s)),
            Arg::I(to_i32(m)?),
            Arg::I(to_i32(w.n)?),
            Arg::I(to_i32(w.k)?),
            Arg::P(ptr(&w.data, s)),
        ];
        if w.fmt == 2 {
            args.push(Arg::I(w.lo));
        }
        if w.fmt != 0 {
            args.push(Arg::P(opt_ptr(w.scale.as_ref(), s)));
            args.push(Arg::P(opt_ptr(w.offset.as_ref(), s)));
            args.push(Arg::I(w.group));
        }
        self.f.launch(
            s,
            self.f.gemm(kind, w.fmt),
            grid,
            kind.block_dim(),
            0,
            &args,
        )
    }

    /// Times the model's matmul shapes (the first layer's four and the head) at `m` rows
    /// with each kernel that can run them, `reps` products each after one warm-up, by CUDA
    /// events: (shape, kernel name, median seconds). `auto` is the kernel the forward pass
    /// picks. For the GPU check's comparison with cuBLAS.
    pub(crate) fn gemm_timings(&self, m: usize, reps: usize) -> Result<Vec<GemmTiming>> {
        let s = &self.stream;
        let Some(l) = self.layers.first() else {
            return Ok(Vec::new());
        };
        let mut out = Vec::new();
        for w in [&l.qkv, &l.wo, &l.gate_up, &l.down, &self.head] {
            let x = s
                .clone_htod(&vec![0.5f32; m * w.k])
                .map_err(|e| dev_err("copying to the device", e))?;
            let mut y = alloc(s, m * w.n)?;
            let auto = GemmKind::choose(None, m, w.shape(), self.sms);
            let mut kinds = vec![("auto", auto)];
            // the other kernels where they could be the better choice: the skinny ones up
            // to 64 rows, the tiled ones from 16
            let others = [
                ("tiled", GemmKind::Tiled, m >= 16),
                ("wide", GemmKind::Wide, m >= 16),
                ("wide1", GemmKind::Wide1, m >= 16),
                ("skinny", GemmKind::Skinny16, m <= 64),
            ];
            for (name, k, _) in others.into_iter().filter(|o| o.2) {
                let k = GemmKind::choose(Some(k), m, w.shape(), self.sms);
                if k != auto && !kinds.iter().any(|&(_, o)| o == k) {
                    kinds.push((name, k));
                }
            }
            for (name, kind) in kinds {
                self.gemm_as(kind, w, &x, m, &mut y)?;
                let mut times = Vec::with_capacity(reps);
                for _ in 0..reps {
                    let ev = |what| {
                        s.record_event(Some(cudarc::driver::sys::CUevent_flags::CU_EVENT_DEFAULT))
                            .map_err(|e| dev_err(what, e))
                    };
                    let start = ev("an event")?;
                    self.gemm_as(kind, w, &x, m, &mut y)?;
                    let end = ev("an event")?;
                    end.synchronize()
                        .map_err(|e| dev_err("a timed product", e))?;
                    let ms = start
                        .elapsed_ms(&end)
                        .map_err(|e| dev_err("an event's time", e))?;
                    times.push(f64::from(ms) / 1e3);
                }
                times.sort_by(f64::total_cmp);
                out.push(GemmTiming {
                    n: w.n,
                    k: w.k,
                    kernel: if name == "auto" {
                        format!("auto ({kind:?})")
                    } else {
                        format!("{kind:?}")
                    },
                    seconds: times.get(times.len() / 2).copied().unwrap_or(0.0),
                });
            }
        }
        Ok(out)
    }

    fn rms_norm(
        &self,
        x: &CudaSlice<f32>,
        w: &CudaSlice<f32>,
        out: &mut CudaSlice<f32>,
        m: usize,
        n: usize,
        eps: f32,
    ) -> Result<()> {
        let s = &self.stream;
        self.f.launch(
            s,
            &self.f.rms_norm_rows,
            (m, 1, 1),
            (256, 1, 1),
            0,
            &[
                Arg::P(ptr(x, s)),
                Arg::P(ptr(w, s)),
                Arg::P(ptr(out, s)),
                Arg::I(to_i32(n)?),
                Arg::F(eps),
            ],
        )
    }

    fn quantize_rows(&self, x: &mut CudaSlice<f32>, m: usize, k: usize) -> Result<()> {
        let s = &self.stream;
        self.f.launch(
            s,
            &self.f.quantize_q8_rows,
            (m, k.div_ceil(32), 1),
            (1, 1, 1),
            0,
            &[Arg::P(ptr(x, s)), Arg::I(to_i32(k)?)],
        )
    }

    fn add(&self, x: &mut CudaSlice<f32>, o: &CudaSlice<f32>, n: usize) -> Result<()> {
        let s = &self.stream;
        self.f.launch(
            s,
            &self.f.add_in_place,
            (n.div_ceil(256), 1, 1),
            (256, 1, 1),
            0,
            &[Arg::P(ptr(x, s)), Arg::P(ptr(o, s)), Arg::L(n as i64)],
        )
    }
}

fn to_i32(v: usize) -> Result<i32> {
    i32::try_from(v).map_err(|_| EngineError::Device(format!("{v} does not fit a kernel's int")))
}

fn htod<T: cudarc::driver::DeviceRepr + cudarc::driver::ValidAsZeroBits>(
    s: &Arc<CudaStream>,
    v: &[T],
) -> Result<CudaSlice<T>> {
    if v.is_empty() {
        // a zero-length allocation is an error on some drivers
        return s
            .alloc_zeros::<T>(1)
            .map_err(|e| dev_err("allocating device memory", e));
    }
    s.clone_htod(v)
        .map_err(|e| dev_err("copying to the device", e))
}

fn alloc(s: &Arc<CudaStream>, n: usize) -> Result<CudaSlice<f32>> {
    s.alloc_zeros::<f32>(n.max(1)).map_err(|e| {
        dev_err(
            &format!("allocating {} MiB on the device", (n * 4) >> 20),
            e,
        )
    })
}

/// Copies a [`Linear`]'s panels to the device as they are.
fn upload_linear(s: &Arc<CudaStream>, lin: &Linear) -> Result<DevLinear> {
    fn bytes_of<T>(v: &[T]) -> &[u8] {
        // SAFETY: plain numbers (f32, i8) have no padding or invalid byte patterns.
        unsafe { std::slice::from_raw_parts(v.as_ptr().cast::<u8>(), std::mem::size_of_val(v)) }
    }
    Ok(match lin.parts() {
        Parts::F32(w) => DevLinear {
            n: lin.n,
            k: lin.k,
            data: htod(s, bytes_of(w))?,
            fmt: 0,
            lo: 0,
            group: 0,
            scale: None,
            offset: None,
        },
        Parts::Quant {
            group,
            q,
            q4,
            lo,
            scale,
            offset,
        } => {
            let (data, fmt) = match q4 {
                Some(q4) => (htod(s, q4)?, 2),
                None => (htod(s, bytes_of(q))?, 1),
            };
            DevLinear {
                n: lin.n,
                k: lin.k,
                data,
                fmt,
                lo: i32::from(lo),
                group: to_i32(group)?,
                scale: Some(htod(s, scale)?),
                offset: Some(htod(s, offset)?),
            }
        }
    })
}
