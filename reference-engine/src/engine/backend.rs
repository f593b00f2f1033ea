//! The engine's backend: the CPU kernels, or a CUDA device when the crate is built with the
//! `cuda` feature and `--device` asks for it (or `auto` finds one).

use crate::device::Device;
use crate::error::Result;
use crate::model::Weights;

/// Where the forward pass and the output head run. Either way the embedding rows, RoPE
/// tables, log-softmax and top-k are the CPU code's.
#[derive(Debug)]
pub(super) enum Backend {
    Cpu,
    #[cfg(feature = "cuda")]
    Cuda(Box<crate::cuda::CudaModel>),
}

/// How much one forward pass takes. Which rows share a pass never changes a result, only
/// how fast they come back: a GPU fills its multiprocessors only with hundreds of rows.
#[derive(Debug, Clone, Copy)]
pub(super) struct PassLimits {
    /// Most rows one forward pass processes.
    pub rows: usize,
    /// Most new tokens one sequence contributes to one pass.
    pub chunk: usize,
    /// f32 logits held at once; rows per head chunk = this / vocab, within 8..=256.
    pub logit_floats: usize,
}

impl Backend {
    pub(super) fn pass_limits(&self) -> PassLimits {
        match self {
            Self::Cpu => PassLimits {
                rows: 512,
                chunk: 256,
                logit_floats: 8 << 20,
            },
            #[cfg(feature = "cuda")]
            Self::Cuda(_) => PassLimits {
                rows: 2048,
                chunk: 1024,
                logit_floats: 16 << 20,
            },
        }
    }

    /// The backend `device` asks for: `auto` takes GPU 0 when CUDA is usable and falls back
    /// to the CPU (saying why in the log) when it is not or the model does not fit.
    pub(super) fn choose(device: Device, w: &Weights) -> Result<Self> {
        match device {
            Device::Cpu => Ok(Self::Cpu),
            Device::Cuda(n) => Self::cuda(w, n),
            Device::Auto => {
                if let Some(why) = crate::device::cuda_unavailable() {
                    tracing::info!("device auto: running on the CPU ({why})");
                    return Ok(Self::Cpu);
                }
                match Self::cuda(w, 0) {
                    Ok(b) => Ok(b),
                    Err(e) => {
                        tracing::warn!("device auto: running on the CPU ({e})");
                        Ok(Self::Cpu)
                    }
                }
            }
        }
    }

    #[cfg(feature = "cuda")]
    fn cuda(w: &Weights, ordinal: usize) -> Result<Self> {
        let g = crate::cuda::CudaModel::load(w, ordinal)?;
        tracing::info!(
            device = g.label(),
            weight_bytes = g.bytes(),
            "engine on the GPU"
        );
        Ok(Self::Cuda(Box::new(g)))
    }

    #[cfg(not(feature = "cuda"))]
    fn cuda(_: &Weights, _: usize) -> Result<Self> {
        Err(crate::error::EngineError::Device(
            crate::device::cuda_unavailable().unwrap_or_default(),
        ))
    }
}

/// A forward pass's final-normed hidden states, where the backend keeps them.
pub(super) enum Hidden {
    Host(Vec<f32>),
    #[cfg(feature = "cuda")]
    Device(crate::cuda::DevHidden),
}
