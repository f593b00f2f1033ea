//! A streaming GGUF v3 writer, the inverse of the `gguf` reader.
//!
//! [`GgufWriter::new`] writes the header at once: the metadata (every [`GgufValue`] type), then
//! the tensor infos, whose offsets follow from the declared shapes and types alone. The tensor
//! data is then streamed in file order with [`GgufWriter::write_data`], in pieces of any size,
//! and each tensor is padded to the file's alignment (`general.alignment` when the metadata
//! sets it, else 32) as it completes; [`GgufWriter::finish`] checks that every tensor got
//! exactly its bytes. Nothing but the header is held in memory, so a file of many gigabytes
//! is written with the memory of one piece. The writer refuses what the reader would refuse
//! (duplicate names, zero or too many dimensions, a row that is not whole blocks, an
//! alignment that is not a power of two, an array whose elements differ in type), so
//! whatever it writes reads back.

use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};

use crate::error::{EngineError, Result};
use crate::gguf::{GgmlType, GgufValue};

/// The GGUF magic as the file's first four bytes.
const MAGIC: &[u8; 4] = b"GGUF";
/// The version written.
const VERSION: u32 = 3;
/// Alignment of tensor data when the metadata does not set `general.alignment`.
const DEFAULT_ALIGNMENT: usize = 32;
/// Buffer between the writer and the file.
const BUF_BYTES: usize = 1 << 20;

/// One tensor to be written: its name, shape and type (the data comes later, streamed).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TensorSpec {
    /// The tensor's name, e.g. `blk.0.attn_q.weight`.
    pub name: String,
    /// ggml dims, innermost (contiguous) first: a weight matrix is `[n_in, n_out]`.
    pub dims: Vec<usize>,
    /// The element type.
    pub ggml_type: GgmlType,
}

impl TensorSpec {
    /// A spec from its parts.
    pub fn new(name: impl Into<String>, dims: &[usize], ggml_type: GgmlType) -> Self {
        Self {
            name: name.into(),
            dims: dims.to_vec(),
            ggml_type,
        }
    }

    /// Number of elements.
    pub fn n_elements(&self) -> usize {
        self.dims.iter().product()
    }

    /// Bytes of the tensor's data, or an error naming what makes the shape impossible.
    pub fn data_size(&self) -> Result<usize> {
        let name = &self.name;
        if self.dims.is_empty() || self.dims.len() > 4 {
            return Err(EngineError::InvalidRequest(format!(
                "tensor {name}: {} dimensions (1 to 4 are allowed)",
                self.dims.len()
            )));
        }
        if self.dims.contains(&0) {
            return Err(EngineError::InvalidRequest(format!(
                "tensor {name}: a dimension is 0"
            )));
        }
        let bs = self.ggml_type.block_size();
        if !self.dims[0].is_multiple_of(bs) {
            return Err(EngineError::InvalidRequest(format!(
                "tensor {name}: row length {} is not a multiple of the {} block size {bs}",
                self.dims[0],
                self.ggml_type.name()
            )));
        }
        self.dims
            .iter()
            .try_fold(1usize, |acc, &d| acc.checked_mul(d))
            .filter(|&n| n < 1 << 40)
            .map(|n| n / bs * self.ggml_type.type_size())
            .ok_or_else(|| {
                EngineError::InvalidRequest(format!("tensor {name}: element count overflows"))
            })
    }
}

/// A GGUF file being written: the header is out, the tensor data is streamed in order.
pub struct GgufWriter<W: Write> {
    /// Where the bytes go.
    out: W,
    /// The file written, for error messages (`<memory>` for other sinks).
    path: PathBuf,
    /// Tensor data alignment.
    alignment: usize,
    /// The tensors and their data sizes, in file order.
    tensors: Vec<(TensorSpec, usize)>,
    /// Index of the tensor whose data is being written.
    current: usize,
    /// Bytes of the current tensor written so far.
    written: usize,
    /// Bytes written to `out` so far (for the padding).
    pos: u64,
}

impl<W: Write> std::fmt::Debug for GgufWriter<W> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GgufWriter")
            .field("path", &self.path)
            .field("tensors", &self.tensors.len())
            .field("current", &self.current)
            .finish_non_exhaustive()
    }
}

impl GgufWriter<BufWriter<File>> {
    /// Creates (or truncates) `path` and writes the header. The caller then streams every
    /// tensor's data and calls [`GgufWriter::finish`].
    pub fn create(
        path: &Path,
        metadata: &[(String, GgufValue)],
        tensors: Vec<TensorSpec>,
    ) -> Result<Self> {
        let file = File::create(path).map_err(|source| EngineError::Write {
            path: path.to_path_buf(),
            source,
        })?;
        Self::new(
            BufWriter::with_capacity(BUF_BYTES, file),
            path,
            metadata,
            tensors,
        )
    }
}

impl<W: Write> GgufWriter<W> {
    /// Writes the header (metadata in the given order, then the tensor infos) to `out`.
    /// `path` only names the sink in errors.
    pub fn new(
        out: W,
        path: &Path,
        metadata: &[(String, GgufValue)],
        tensors: Vec<TensorSpec>,
    ) -> Result<Self> {
        let alignment = alignment_of(metadata)?;
        let mut header = Vec::new();
        header.extend_from_slice(MAGIC);
        header.extend_from_slice(&VERSION.to_le_bytes());
        header.extend_from_slice(&(tensors.len() as u64).to_le_bytes());
        header.extend_from_slice(&(metadata.len() as u64).to_le_bytes());
        let mut keys = std::collections::BTreeSet::new();
        for (key, value) in metadata {
            if !keys.insert(key.as_str()) {
                return Err(EngineError::InvalidRequest(format!(
                    "metadata key {key} is given twice"
                )));
            }
            put_str(&mut header, key);
            header.extend_from_slice(&type_id(value).to_le_bytes());
            put_value(&mut header, key, value)?;
        }
        let mut names = std::collections::BTreeSet::new();
        let mut sized = Vec::with_capacity(tensors.len());
        let mut offset = 0usize;
        for t in tensors {
            let size = t.data_size()?;
            if !names.insert(t.name.clone()) {
                return Err(EngineError::InvalidRequest(format!(
                    "tensor {} is given twice",
                    t.name
                )));
            }
            put_str(&mut header, &t.name);
            header.extend_from_slice(&(t.dims.len() as u32).to_le_bytes());
            for &d in &t.dims {
                header.extend_from_slice(&(d as u64).to_le_bytes());
            }
            header.extend_from_slice(&type_code(t.ggml_type).to_le_bytes());
            header.extend_from_slice(&(offset as u64).to_le_bytes());
            offset = offset
                .checked_add(size.next_multiple_of(alignment))
                .ok_or_else(|| EngineError::InvalidRequest("tensor data overflows".into()))?;
            sized.push((t, size));
        }
        let mut w = Self {
            out,
            path: path.to_path_buf(),
            alignment,
            tensors: sized,
            current: 0,
            written: 0,
            pos: 0,
        };
        w.put(&header)?;
        w.pad()?;
        Ok(w)
    }

    /// The tensor whose data [`GgufWriter::write_data`] writes next, None when all are done.
    pub fn next_tensor(&self) -> Option<&TensorSpec> {
        self.tensors.get(self.current).map(|(t, _)| t)
    }

    /// Bytes written so far: after [`GgufWriter::new`], the header and its padding.
    pub fn position(&self) -> u64 {
        self.pos
    }

    /// Appends `bytes` to the data of the current tensor; a tensor may take any number of
    /// calls, and one call never spans two tensors. Bytes past the tensor's size are an error.
    pub fn write_data(&mut self, bytes: &[u8]) -> Result<()> {
        let Some((t, size)) = self.tensors.get(self.current) else {
            return Err(EngineError::InvalidRequest(format!(
                "{}: {} bytes of tensor data after the last tensor",
                self.path.display(),
                bytes.len()
            )));
        };
        let size = *size;
        if bytes.len() > size - self.written {
            return Err(EngineError::InvalidRequest(format!(
                "tensor {}: {} bytes written past its {size}",
                t.name,
                self.written + bytes.len() - size
            )));
        }
        self.put(bytes)?;
        self.written += bytes.len();
        if self.written == size {
            self.pad()?;
            self.current += 1;
            self.written = 0;
        }
        Ok(())
    }

    /// Checks that every tensor's data was written, flushes, and returns the sink.
    pub fn finish(mut self) -> Result<W> {
        if let Some((t, size)) = self.tensors.get(self.current) {
            return Err(EngineError::InvalidRequest(format!(
                "{}: tensor {} has {} of its {size} bytes ({} tensors left)",
                self.path.display(),
                t.name,
                self.written,
                self.tensors.len() - self.current
            )));
        }
        self.out.flush().map_err(|source| EngineError::Write {
            path: self.path.clone(),
            source,
        })?;
        Ok(self.out)
    }

    fn put(&mut self, bytes: &[u8]) -> Result<()> {
        self.out
            .write_all(bytes)
            .map_err(|source| EngineError::Write {
                path: self.path.clone(),
                source,
            })?;
        self.pos += bytes.len() as u64;
        Ok(())
    }

    /// Zero bytes up to the next multiple of the alignment.
    fn pad(&mut self) -> Result<()> {
        let a = self.alignment as u64;
        let n = (self.pos.next_multiple_of(a) - self.pos) as usize;
        self.put(&vec![0u8; n])
    }
}

/// The alignment the metadata asks for (`general.alignment`), else 32.
fn alignment_of(metadata: &[(String, GgufValue)]) -> Result<usize> {
    let Some((_, v)) = metadata.iter().find(|(k, _)| k == "general.alignment") else {
        return Ok(DEFAULT_ALIGNMENT);
    };
    v.as_u64()
        .and_then(|a| usize::try_from(a).ok())
        .filter(|a| a.is_power_of_two() && *a <= 1 << 20)
        .ok_or_else(|| {
            EngineError::InvalidRequest(format!(
                "general.alignment {v:?} is not a power of two up to 2^20"
            ))
        })
}

/// ggml's numeric id of a tensor type (the inverse of `GgmlType::from_id`).
fn type_code(t: GgmlType) -> u32 {
    match t {
        GgmlType::F32 => 0,
        GgmlType::F16 => 1,
        GgmlType::Q4_0 => 2,
        GgmlType::Q4_1 => 3,
        GgmlType::Q5_0 => 6,
        GgmlType::Q5_1 => 7,
        GgmlType::Q8_0 => 8,
        GgmlType::Q8_1 => 9,
        GgmlType::Q2K => 10,
        GgmlType::Q3K => 11,
        GgmlType::Q4K => 12,
        GgmlType::Q5K => 13,
        GgmlType::Q6K => 14,
        GgmlType::Q8K => 15,
        GgmlType::BF16 => 30,
    }
}

/// GGUF's metadata value type id.
fn type_id(v: &GgufValue) -> u32 {
    match v {
        GgufValue::U8(_) => 0,
        GgufValue::I8(_) => 1,
        GgufValue::U16(_) => 2,
        GgufValue::I16(_) => 3,
        GgufValue::U32(_) => 4,
        GgufValue::I32(_) => 5,
        GgufValue::F32(_) => 6,
        GgufValue::Bool(_) => 7,
        GgufValue::String(_) => 8,
        GgufValue::Array(_) => 9,
        GgufValue::U64(_) => 10,
        GgufValue::I64(_) => 11,
        GgufValue::F64(_) => 12,
    }
}

fn put_str(out: &mut Vec<u8>, s: &str) {
    out.extend_from_slice(&(s.len() as u64).to_le_bytes());
    out.extend_from_slice(s.as_bytes());
}

/// A value's bytes, without its type id (an array writes its element type and length).
fn put_value(out: &mut Vec<u8>, key: &str, v: &GgufValue) -> Result<()> {
    match v {
        GgufValue::U8(x) => out.push(*x),
        GgufValue::I8(x) => out.extend_from_slice(&x.to_le_bytes()),
        GgufValue::U16(x) => out.extend_from_slice(&x.to_le_bytes()),
        GgufValue::I16(x) => out.extend_from_slice(&x.to_le_bytes()),
        GgufValue::U32(x) => out.extend_from_slice(&x.to_le_bytes()),
        GgufValue::I32(x) => out.extend_from_slice(&x.to_le_bytes()),
        GgufValue::U64(x) => out.extend_from_slice(&x.to_le_bytes()),
        GgufValue::I64(x) => out.extend_from_slice(&x.to_le_bytes()),
        GgufValue::F32(x) => out.extend_from_slice(&x.to_le_bytes()),
        GgufValue::F64(x) => out.extend_from_slice(&x.to_le_bytes()),
        GgufValue::Bool(x) => out.push(u8::from(*x)),
        GgufValue::String(s) => put_str(out, s),
        GgufValue::Array(items) => {
            // an empty array's element type is not kept by the reader: write it as u8
            let elem = items.first().map_or(0, type_id);
            if items.iter().any(|x| type_id(x) != elem) {
                return Err(EngineError::InvalidRequest(format!(
                    "metadata {key}: an array's elements must all have one type"
                )));
            }
            out.extend_from_slice(&elem.to_le_bytes());
            out.extend_from_slice(&(items.len() as u64).to_le_bytes());
            for x in items {
                put_value(out, key, x)?;
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gguf::GgufFile;

    fn write(meta: &[(String, GgufValue)], tensors: Vec<TensorSpec>) -> Result<Vec<u8>> {
        let mut w = GgufWriter::new(Vec::new(), Path::new("<memory>"), meta, tensors)?;
        while let Some(t) = w.next_tensor() {
            let n = t.data_size()?;
            let fill = t.name.len() as u8;
            w.write_data(&vec![fill; n])?;
        }
        w.finish()
    }

    #[test]
    fn every_type_code_reads_back_as_its_type() {
        for id in 0..40 {
            if let Some(t) = GgmlType::from_id(id) {
                assert_eq!(type_code(t), id, "{t:?}");
            }
        }
    }

    #[test]
    fn alignment_from_metadata_is_honoured() -> Result<()> {
        let meta = vec![("general.alignment".to_owned(), GgufValue::U32(64))];
        let bytes = write(
            &meta,
            vec![
                TensorSpec::new("a", &[3], GgmlType::F32),
                TensorSpec::new("b", &[32, 2], GgmlType::Q8_0),
            ],
        )?;
        let g = GgufFile::from_bytes(&bytes)?;
        assert_eq!(g.alignment, 64);
        assert_eq!(g.tensors[1].offset, 64);
        assert_eq!(g.tensor_bytes(&g.tensors[1]), &[1u8; 68][..]);
        Ok(())
    }

    #[test]
    fn what_the_reader_refuses_is_refused() {
        let t = |name: &str, dims: &[usize], ty| TensorSpec::new(name, dims, ty);
        type Meta = Vec<(String, GgufValue)>;
        let bad: Vec<(Meta, Vec<TensorSpec>, &str)> = vec![
            (vec![], vec![t("a", &[31], GgmlType::Q4_1)], "block size"),
            (vec![], vec![t("a", &[0], GgmlType::F32)], "dimension is 0"),
            (vec![], vec![t("a", &[1; 5], GgmlType::F32)], "5 dimensions"),
            (
                vec![],
                vec![t("a", &[1], GgmlType::F32), t("a", &[1], GgmlType::F32)],
                "twice",
            ),
            (
                vec![("general.alignment".into(), GgufValue::U32(24))],
                vec![],
                "power of two",
            ),
            (
                vec![(
                    "x".into(),
                    GgufValue::Array(vec![GgufValue::U8(1), GgufValue::I8(1)]),
                )],
                vec![],
                "one type",
            ),
            (
                vec![
                    ("x".into(), GgufValue::U8(1)),
                    ("x".into(), GgufValue::U8(2)),
                ],
                vec![],
                "twice",
            ),
        ];
        for (meta, tensors, want) in bad {
            let err = write(&meta, tensors).map(|_| ()).err();
            let msg = err.map(|e| e.to_string()).unwrap_or_default();
            assert!(msg.contains(want), "{want}: {msg:?}");
        }
    }

    #[test]
    fn data_must_be_exactly_the_declared_bytes() -> Result<()> {
        let spec = vec![TensorSpec::new("a", &[4], GgmlType::F32)];
        let mut w = GgufWriter::new(Vec::new(), Path::new("<memory>"), &[], spec.clone())?;
        assert!(w.write_data(&[0; 17]).is_err());
        w.write_data(&[0; 10])?;
        let err = w.finish().err().map(|e| e.to_string()).unwrap_or_default();
        assert!(err.contains("has 10 of its 16 bytes"), "{err}");
        let mut w = GgufWriter::new(Vec::new(), Path::new("<memory>"), &[], spec)?;
        w.write_data(&[0; 16])?;
        assert!(w.next_tensor().is_none());
        assert!(w.write_data(&[0]).is_err());
        Ok(())
    }
}
