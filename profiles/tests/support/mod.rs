//! Helpers the profile tests share: safetensors files written from a tensor table, with a
//! sparse (zero) data section, so that only their headers cost anything.

use serde_json::json;
use std::fs::File;
use std::io::Write;
use std::path::Path;

/// Bytes per element of the safetensors dtypes these tests write (the format's table).
pub fn element_bytes(dtype: &str) -> u64 {
    match dtype {
        "F64" | "I64" => 8,
        "F32" | "I32" => 4,
        "F16" | "BF16" => 2,
        "F8_E4M3" | "U8" | "I8" => 1,
        other => panic!("test table lacks {other}"),
    }
}

/// Writes a safetensors file whose data section is zeros (sparse), returning its tensor bytes.
pub fn write_safetensors(path: &Path, tensors: &[(String, &str, Vec<u64>)]) -> u64 {
    let mut header = serde_json::Map::new();
    let mut offset = 0u64;
    for (name, dtype, shape) in tensors {
        let bytes = shape.iter().product::<u64>() * element_bytes(dtype);
        header.insert(
            name.clone(),
            json!({"dtype": dtype, "shape": shape, "data_offsets": [offset, offset + bytes]}),
        );
        offset += bytes;
    }
    header.insert("__metadata__".into(), json!({"format": "pt"}));
    let mut text = serde_json::to_vec(&header).unwrap();
    while !text.len().is_multiple_of(8) {
        text.push(b' ');
    }
    let mut file = File::create(path).unwrap();
    file.write_all(&(text.len() as u64).to_le_bytes()).unwrap();
    file.write_all(&text).unwrap();
    file.set_len(8 + text.len() as u64 + offset).unwrap();
    offset
}
