//! Where the forward pass runs: `--device auto|cpu|cuda[:N]`.
//!
//! `cpu` is the packed-panel CPU kernels. `cuda[:N]` is the CUDA backend on GPU N (built
//! with the `cuda` feature; the CUDA libraries are loaded at run time, so a build with the
//! feature still runs, and its tests pass, on a machine with no CUDA at all: asking for
//! `cuda` there is a clear error). `auto` takes GPU 0 when the libraries and a device are
//! present and the CPU otherwise, saying which in the log.

use std::fmt;
use std::str::FromStr;

/// A device choice.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Device {
    /// GPU 0 when CUDA is usable, else the CPU.
    Auto,
    /// The CPU kernels.
    #[default]
    Cpu,
    /// The CUDA backend on this GPU ordinal.
    Cuda(usize),
}

impl FromStr for Device {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "auto" => Ok(Self::Auto),
            "cpu" => Ok(Self::Cpu),
            "cuda" => Ok(Self::Cuda(0)),
            _ => match s.strip_prefix("cuda:").map(str::parse::<usize>) {
                Some(Ok(n)) => Ok(Self::Cuda(n)),
                _ => Err(format!(
                    "unknown device {s:?}: expected auto, cpu, cuda or cuda:N (N a GPU ordinal)"
                )),
            },
        }
    }
}

impl fmt::Display for Device {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Auto => f.write_str("auto"),
            Self::Cpu => f.write_str("cpu"),
            Self::Cuda(n) => write!(f, "cuda:{n}"),
        }
    }
}

/// Why the CUDA backend cannot run here, or None when it can (the libraries load and at
/// least one device is present). Never panics and never creates a context.
pub fn cuda_unavailable() -> Option<String> {
    #[cfg(feature = "cuda")]
    {
        crate::cuda::unavailable()
    }
    #[cfg(not(feature = "cuda"))]
    {
        Some("this build has no CUDA backend (built without the `cuda` feature)".into())
    }
}

/// One GPU matmul shape's timing ([`crate::Engine::gpu_gemm_timings`]).
#[derive(Debug, Clone)]
pub struct GemmTiming {
    /// Output columns.
    pub n: usize,
    /// Input length.
    pub k: usize,
    /// The kernel (`auto (…)` for the one the forward pass picks).
    pub kernel: String,
    /// Seconds per product, the median of the repeats.
    pub seconds: f64,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn device_names_parse_and_print_back() {
        for (s, d) in [
            ("auto", Device::Auto),
            ("cpu", Device::Cpu),
            ("cuda", Device::Cuda(0)),
            ("cuda:3", Device::Cuda(3)),
        ] {
            assert_eq!(s.parse::<Device>(), Ok(d));
        }
        assert_eq!(Device::Cuda(3).to_string(), "cuda:3");
        assert_eq!(
            "cuda".parse::<Device>().map(|d| d.to_string()),
            Ok("cuda:0".into())
        );
        for bad in ["gpu", "cuda:", "cuda:x", "cuda:-1", "CPU", ""] {
            let err = bad.parse::<Device>().expect_err(bad);
            assert!(err.contains("expected auto, cpu, cuda or cuda:N"), "{err}");
        }
    }
}
