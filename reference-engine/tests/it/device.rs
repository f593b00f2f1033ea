//! `--device`: the CUDA backend where CUDA is usable, else a clear error for `cuda` and the
//! CPU for `auto`; either way the numbers are the CPU backend's.

use crate::common;

use samewise_engine::cuda_unavailable;
use samewise_engine::{Device, Engine, EngineError, LoadOptions};

fn load(device: Device) -> Result<Engine, EngineError> {
    Engine::load(
        &common::model_path().map_err(|e| EngineError::InvalidRequest(e.to_string()))?,
        LoadOptions {
            threads: 2,
            device,
            ..LoadOptions::default()
        },
    )
}

#[test]
fn cuda_where_usable_and_a_clear_error_or_the_cpu_where_not() -> anyhow::Result<()> {
    let cpu = load(Device::Cpu)?;
    assert_eq!(cpu.device(), "cpu");
    assert_eq!(cpu.device_weight_bytes(), 0);
    let seqs: Vec<Vec<u32>> = vec![
        (0..40).map(|i| (i * 811 + 3) % 49_152).collect(),
        (0..7).map(|i| (i * 97 + 11) % 49_152).collect(),
    ];
    let want = cpu.score(&seqs, 5)?;
    match cuda_unavailable() {
        Some(why) => {
            // asking for the GPU is an error that says why, not a panic inside cudarc
            for d in [Device::Cuda(0), Device::Cuda(3)] {
                let err = load(d).expect_err("a CUDA engine without CUDA");
                assert!(matches!(err, EngineError::Device(_)), "{err:?}");
                assert!(err.to_string().contains(&why), "{err} does not say {why}");
            }
            // auto falls back to the CPU, with the CPU's numbers
            let auto = load(Device::Auto)?;
            assert_eq!(auto.device(), "cpu");
            assert_eq!(auto.score(&seqs, 5)?, want);
        }
        None => {
            // a GPU: `cuda` and `auto` both run there, with the CPU's numbers bit for bit
            for d in [Device::Cuda(0), Device::Auto] {
                let g = load(d)?;
                assert!(g.device().starts_with("cuda:0 ("), "{}", g.device());
                assert!(g.device_weight_bytes() > 0);
                assert_eq!(g.score(&seqs, 5)?, want, "{d}");
            }
            let err = load(Device::Cuda(999)).expect_err("GPU 999");
            assert!(err.to_string().contains("no CUDA device 999"), "{err}");
        }
    }
    Ok(())
}
