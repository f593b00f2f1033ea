//! A real model cut to its first layers: the source GGUF's metadata with
//! `<arch>.block_count` set to the cut, and its tensors in file order except `blk.{i}.*` for
//! every layer `i` past the cut, copied byte for byte from the source's memory map in
//! pieces (a model of any size is cut with a few MiB of memory).

use std::path::Path;

use crate::error::{EngineError, Result};
use crate::gguf::{GgufFile, GgufValue};
use crate::gguf_write::{GgufWriter, TensorSpec};

use super::{SynthReport, write_atomically};

/// Bytes copied per write.
const PIECE: usize = 8 << 20;

/// Writes `from` cut to its first `layers` layers to `out`.
pub fn cut_layers(from: &Path, layers: usize, out: &Path) -> Result<SynthReport> {
    let same = |a: &Path, b: &Path| match (a.canonicalize(), b.canonicalize()) {
        (Ok(a), Ok(b)) => a == b,
        _ => false,
    };
    if same(from, out) {
        return Err(EngineError::InvalidRequest(format!(
            "--out {} is the model being cut",
            out.display()
        )));
    }
    let src = GgufFile::open(from)?;
    let arch = src
        .get_str("general.architecture")
        .ok_or_else(|| EngineError::MissingMetadata("general.architecture".into()))?;
    let key = format!("{arch}.block_count");
    let n_layer = src
        .get_usize(&key)
        .ok_or_else(|| EngineError::MissingMetadata(key.clone()))?;
    if layers == 0 || layers > n_layer {
        return Err(EngineError::InvalidRequest(format!(
            "--layers {layers}: {} has {n_layer} layers (cut to 1 to {n_layer})",
            from.display()
        )));
    }
    let meta: Vec<(String, GgufValue)> = src
        .metadata
        .iter()
        .map(|(k, v)| {
            let v = if *k == key {
                GgufValue::U32(layers as u32)
            } else {
                v.clone()
            };
            (k.clone(), v)
        })
        .collect();
    let kept: Vec<_> = src
        .tensors
        .iter()
        .filter(|t| layer_of(&t.name).is_none_or(|i| i < layers))
        .collect();
    let specs = kept
        .iter()
        .map(|t| TensorSpec::new(t.name.clone(), &t.dims, t.ggml_type))
        .collect();
    let bytes = write_atomically(out, |file| {
        let mut w = GgufWriter::new(file, out, &meta, specs)?;
        for t in &kept {
            for piece in src.tensor_bytes(t).chunks(PIECE) {
                w.write_data(piece)?;
            }
        }
        w.finish().map(drop)
    })?;
    Ok(SynthReport {
        path: out.to_path_buf(),
        bytes,
        tensors: kept.len(),
        n_layer: layers,
    })
}

/// The layer of a `blk.{i}.…` tensor.
fn layer_of(name: &str) -> Option<usize> {
    let rest = name.strip_prefix("blk.")?;
    rest.split('.').next()?.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn layers_are_read_from_block_names_only() {
        assert_eq!(layer_of("blk.12.attn_q.weight"), Some(12));
        assert_eq!(layer_of("blk.0.ffn_norm.weight"), Some(0));
        assert_eq!(layer_of("token_embd.weight"), None);
        assert_eq!(layer_of("output.weight"), None);
        assert_eq!(layer_of("blkx.1.a"), None);
    }
}
