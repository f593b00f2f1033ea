//! Hugging Face model directories: `config.json` plus `model.safetensors` or shards listed
//! in `model.safetensors.index.json`. Files are memory-mapped; tensors are F32, F16 or BF16
//! and come out as f32 rows in the HF layout (`[out][in]`, rotate-half RoPE for Q/K).

use std::collections::BTreeMap;
use std::fs::File;
use std::path::{Path, PathBuf};

use half::{bf16, f16};
use safetensors::{Dtype, SafeTensors};

use crate::error::{EngineError, Result};

/// One tensor's location.
#[derive(Debug, Clone)]
struct Entry {
    /// Index into `HfDir::maps`.
    file: usize,
    dtype: Dtype,
    shape: Vec<usize>,
    /// Absolute byte range in the file.
    start: usize,
    end: usize,
}

/// An opened HF model directory.
pub struct HfDir {
    /// The parsed `config.json`.
    pub config: serde_json::Value,
    maps: Vec<memmap2::Mmap>,
    tensors: BTreeMap<String, Entry>,
}

impl std::fmt::Debug for HfDir {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HfDir")
            .field("files", &self.maps.len())
            .field("tensors", &self.tensors.len())
            .finish()
    }
}

fn read(path: &Path) -> Result<Vec<u8>> {
    std::fs::read(path).map_err(|source| EngineError::Io {
        path: path.to_path_buf(),
        source,
    })
}

impl HfDir {
    /// Opens `dir`: reads config.json and maps every safetensors file.
    pub fn open(dir: &Path) -> Result<Self> {
        let config: serde_json::Value = serde_json::from_slice(&read(&dir.join("config.json"))?)
            .map_err(|e| EngineError::InvalidHf(format!("config.json: {e}")))?;
        let single = dir.join("model.safetensors");
        let index = dir.join("model.safetensors.index.json");
        let files: Vec<PathBuf> = if single.is_file() {
            vec![single]
        } else if index.is_file() {
            let idx: serde_json::Value = serde_json::from_slice(&read(&index)?).map_err(|e| {
                EngineError::InvalidHf(format!("model.safetensors.index.json: {e}"))
            })?;
            let map = idx
                .get("weight_map")
                .and_then(serde_json::Value::as_object)
                .ok_or_else(|| EngineError::InvalidHf("index has no weight_map".into()))?;
            let mut names: Vec<&str> = map.values().filter_map(serde_json::Value::as_str).collect();
            names.sort_unstable();
            names.dedup();
            let mut out = Vec::new();
            for n in names {
                if n.contains('/') || n.contains("..") {
                    return Err(EngineError::InvalidHf(format!(
                        "shard name {n:?} leaves the directory"
                    )));
                }
                out.push(dir.join(n));
            }
            out
        } else {
            return Err(EngineError::InvalidHf(format!(
                "{} has neither model.safetensors nor model.safetensors.index.json",
                dir.display()
            )));
        };
        let mut maps = Vec::new();
        for path in &files {
            let f = File::open(path).map_err(|source| EngineError::Io {
                path: path.clone(),
                source,
            })?;
            // SAFETY: read-only private map (see GgufFile::open).
            let map = unsafe { memmap2::Mmap::map(&f) }.map_err(|source| EngineError::Io {
                path: path.clone(),
                source,
            })?;
            maps.push((path.display().to_string(), map));
        }
        Self::from_maps(config, maps)
    }

    /// A directory held in memory: `config.json`'s bytes and one `model.safetensors` file's
    /// (copied into an anonymous map; the fuzz target `safetensors` and its corpus replay read
    /// files this way).
    pub fn from_bytes(config_json: &[u8], safetensors: &[u8]) -> Result<Self> {
        let config: serde_json::Value = serde_json::from_slice(config_json)
            .map_err(|e| EngineError::InvalidHf(format!("config.json: {e}")))?;
        let io = |source| EngineError::Io {
            path: "<memory>".into(),
            source,
        };
        if safetensors.len() < 8 {
            return Err(EngineError::InvalidHf(format!(
                "model.safetensors: {} bytes, shorter than its header length",
                safetensors.len()
            )));
        }
        let mut map = memmap2::MmapMut::map_anon(safetensors.len()).map_err(io)?;
        map.copy_from_slice(safetensors);
        let map = map.make_read_only().map_err(io)?;
        Self::from_maps(config, vec![("model.safetensors".to_owned(), map)])
    }

    /// Indexes the tensors of mapped safetensors files (`name` is for errors), checking every
    /// tensor's byte range against its file.
    fn from_maps(config: serde_json::Value, files: Vec<(String, memmap2::Mmap)>) -> Result<Self> {
        let mut maps = Vec::new();
        let mut tensors = BTreeMap::new();
        for (i, (name, map)) in files.into_iter().enumerate() {
            let (header_len, meta) = SafeTensors::read_metadata(&map)
                .map_err(|e| EngineError::InvalidHf(format!("{name}: {e}")))?;
            let base = 8 + header_len;
            for (tensor, info) in meta.tensors() {
                let (s, e) = info.data_offsets;
                let (start, end) = (base + s, base + e);
                if end > map.len() || start > end {
                    return Err(EngineError::InvalidHf(format!(
                        "{tensor}: data runs past the end of {name}"
                    )));
                }
                tensors.insert(
                    tensor,
                    Entry {
                        file: i,
                        dtype: info.dtype,
                        shape: info.shape.clone(),
                        start,
                        end,
                    },
                );
            }
            maps.push(map);
        }
        Ok(Self {
            config,
            maps,
            tensors,
        })
    }

    /// The tensors' names, in order.
    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.tensors.keys().map(String::as_str)
    }

    /// Whether a tensor exists.
    pub fn has(&self, name: &str) -> bool {
        self.tensors.contains_key(name)
    }

    /// A tensor's shape.
    pub fn shape(&self, name: &str) -> Result<&[usize]> {
        self.tensors
            .get(name)
            .map(|e| e.shape.as_slice())
            .ok_or_else(|| EngineError::MissingTensor(name.into()))
    }

    /// A whole tensor as f32, row-major.
    pub fn tensor_f32(&self, name: &str) -> Result<Vec<f32>> {
        let e = self
            .tensors
            .get(name)
            .ok_or_else(|| EngineError::MissingTensor(name.into()))?;
        let bytes = &self.maps[e.file][e.start..e.end];
        let n: usize = e.shape.iter().product();
        let (width, conv): (usize, fn(&[u8]) -> f32) = match e.dtype {
            Dtype::F32 => (4, |c| f32::from_le_bytes([c[0], c[1], c[2], c[3]])),
            Dtype::F16 => (2, |c| f16::from_le_bytes([c[0], c[1]]).to_f32()),
            Dtype::BF16 => (2, |c| bf16::from_le_bytes([c[0], c[1]]).to_f32()),
            other => {
                return Err(EngineError::UnsupportedTensorType {
                    tensor: name.into(),
                    type_name: format!("{other:?}"),
                });
            }
        };
        if bytes.len() != n * width {
            return Err(EngineError::InvalidHf(format!(
                "{name}: {} bytes for {n} elements",
                bytes.len()
            )));
        }
        Ok(bytes.chunks_exact(width).map(conv).collect())
    }
}
