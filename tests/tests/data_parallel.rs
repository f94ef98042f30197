//! Data parallelism on the command line as users run it: `estimate --parallel ddp` reports every
//! rank (one per GPU of the profile, each against its own memory), `plan --parallel ddp` places
//! nothing and writes no layer-split map, and `check --parallel ddp MAP` takes one rank's map
//! and checks that each replica fits. The seed case is a graph network (a custom model) trained
//! with DDP on four GPUs.

use vramplan_tests::{Output, assert_refused, vramplan, write};

/// A message-passing graph network described from scratch: node and edge encoders, six
/// message-passing layers, a scalar readout; fp32, activations per graph of the batch.
const GNN: &str = "\
name: gnn-mpnn
architecture: GraphNetwork
dtype: fp32
hidden_size: 1024
activations:
  per_sample: 96MiB
modules:
  - name: node_encoder
    linear: {in: 128, out: 1024, bias: true}
  - name: edge_encoder
    linear: {in: 16, out: 1024, bias: true}
  - name: layers
    repeat: 6
    class: MessagePassingLayer
    modules:
      - name: message.lin1
        linear: {in: 3072, out: 1024, bias: true}
      - name: message.lin2
        linear: {in: 1024, out: 1024, bias: true}
      - name: update.lin1
        linear: {in: 2048, out: 1024, bias: true}
      - name: update.lin2
        linear: {in: 1024, out: 1024, bias: true}
      - name: norm
        norm: {dim: 1024}
  - name: readout
    linear: {in: 1024, out: 1, bias: true}
";

/// The GNN's parameters by hand: encoders 128·1024 + 1024 and 16·1024 + 1024; per layer
/// 3072·1024 + 1024, 1024·1024 + 1024, 2048·1024 + 1024, 1024·1024 + 1024 and a norm of 2·1024;
/// the readout 1024 + 1.
const GNN_PARAMS: u64 = (128 * 1024 + 1024)
    + (16 * 1024 + 1024)
    + 6 * ((3072 * 1024 + 1024) + 2 * (1024 * 1024 + 1024) + (2048 * 1024 + 1024) + 2 * 1024)
    + (1024 + 1);

/// What PyTorch's caching allocator charges one request over 10 MiB from a new segment: the
/// request rounded up to 512 B, the segment to 2 MiB, the rest split off only when more than
/// 1 MiB remains (c10/cuda/CUDACachingAllocator.cpp).
fn charged_new_large_segment(bytes: u64) -> u64 {
    let size = bytes.div_ceil(512) * 512;
    let segment = size.div_ceil(2 << 20) * (2 << 20);
    if segment - size > 1 << 20 { size } else { segment }
}

fn u(value: &serde_json::Value) -> u64 {
    value.as_u64().unwrap_or_else(|| panic!("not a number: {value}"))
}

fn ids(json: &serde_json::Value) -> Vec<u64> {
    json["devices"].as_array().expect("devices").iter().map(|d| u(&d["id"])).collect()
}

fn ok(out: &Output) -> &Output {
    assert!(out.code <= 1, "stdout:\n{}\nstderr:\n{}", out.stdout, out.stderr);
    out
}

#[test]
fn estimate_ddp_reports_every_rank() {
    let args = ["estimate", "llama-3.2-1b", "--hardware", "4xa10g", "--mode", "train", "--parallel", "ddp"];
    let text = vramplan(&args);
    assert_eq!(text.code, 0, "{}", text.stderr);
    assert!(text.stdout.starts_with("data parallel, DDP over 4 GPUs"), "{}", text.stdout);
    for rank in 0..4 {
        assert!(text.stdout.contains(&format!("GPU {rank}  NVIDIA A10G  fits")), "{}", text.stdout);
    }
    let json = vramplan(&[&args[..], &["--json"]].concat()).json();
    assert_eq!(ids(&json), vec![0, 1, 2, 3]);
    let first = &json["devices"][0];
    for d in json["devices"].as_array().unwrap() {
        assert_eq!(d["peak_reserved_bytes"], first["peak_reserved_bytes"]);
    }
}

#[test]
fn graph_network_with_ddp_on_four_gpus() {
    let dir = tempfile::tempdir().unwrap();
    let gnn = write(dir.path(), "gnn.yaml", GNN);
    let inspected = vramplan(&["inspect", &gnn, "--json"]).json();
    assert_eq!(u(&inspected["params"]), GNN_PARAMS);
    let train = ["--mode", "train", "--batch", "8", "--seq", "1", "--json"];
    let ddp = vramplan(
        &[&["estimate", gnn.as_str(), "--hardware", "4xa10g", "--parallel", "ddp"][..], &train].concat(),
    );
    assert_eq!(ddp.code, 0, "{}", ddp.stderr);
    let ddp = ddp.json();
    assert_eq!(ids(&ddp), vec![0, 1, 2, 3]);
    // One replica trained alone on one A10G holds the same between steps, less DDP's bucket:
    // the fp32 gradients' second copy, one block of the caching allocator (give or take one
    // unsplit remainder, ≤ 1 MiB, where the block's split-off rest moves a later allocation).
    let alone =
        ok(&vramplan(&[&["estimate", gnn.as_str(), "--hardware", "a10g"][..], &train].concat())).json();
    let bucket = charged_new_large_segment(4 * GNN_PARAMS) as i64;
    for d in ddp["devices"].as_array().unwrap() {
        let held = u(&d["steady_bytes"]) as i64 - u(&alone["devices"][0]["steady_bytes"]) as i64;
        assert!((held - bucket).abs() <= 1 << 20, "{held} held, {bucket} charged");
        let peak =
            u(&d["peak_allocated_bytes"]) as i64 - u(&alone["devices"][0]["peak_allocated_bytes"]) as i64;
        assert!(peak >= bucket - (1 << 20), "the bucket is live at the peak: {peak} more");
        assert_eq!(d["fits"], true);
    }
}

#[test]
fn plan_ddp_writes_no_layer_split() {
    let dir = tempfile::tempdir().unwrap();
    let base = ["plan", "llama-3.2-1b", "--hardware", "4xa10g", "--mode", "train", "--parallel", "ddp"];
    let json = vramplan(&[&base[..], &["--json"]].concat());
    assert_eq!(json.code, 0, "{}", json.stderr);
    let json = json.json();
    assert_eq!(json["device_map"], serde_json::json!({}));
    assert_eq!(json["data_parallel"]["kind"], "ddp");
    assert_eq!(json["verdict"], "fits");
    let devices = json["devices"].as_array().unwrap();
    assert_eq!(
        devices.iter().map(|d| d["device"].clone()).collect::<Vec<_>>(),
        (0..4).map(|g| serde_json::json!(g)).collect::<Vec<_>>()
    );
    for d in devices {
        // Every rank holds every unit: the embedding to the head.
        let units: Vec<&str> = d["units"].as_array().unwrap().iter().map(|x| x.as_str().unwrap()).collect();
        assert!(units.contains(&"model.embed_tokens") && units.contains(&"model.layers.15"), "{units:?}");
        assert!(u(&d["estimate"]["peak_reserved_bytes"]) <= u(&d["limit_bytes"]));
    }
    let text = vramplan(&base);
    assert!(text.stdout.contains("no device map"), "{}", text.stdout);
    // No accelerate map to write: refused before anything is written.
    let map = dir.path().join("map.json");
    let out = vramplan(&[&base[..], &["-o", map.to_str().unwrap()]].concat());
    assert_refused(&out, &["-o", "--parallel ddp needs no device map", "plan.yaml"]);
    assert!(!map.exists());
    // The YAML plan is kept, and reads back as every rank.
    let plan = dir.path().join("plan.yaml");
    let out = vramplan(&[&base[..], &["-o", plan.to_str().unwrap()]].concat());
    assert_eq!(out.code, 0, "{}", out.stderr);
    let written = std::fs::read_to_string(&plan).unwrap();
    assert!(written.contains("device_map: {}"), "{written}");
    let back = vramplan(&[
        "estimate",
        "llama-3.2-1b",
        "--hardware",
        "4xa10g",
        "--plan",
        plan.to_str().unwrap(),
        "--json",
    ]);
    assert_eq!(back.code, 0, "{}", back.stderr);
    assert_eq!(ids(&back.json()), vec![0, 1, 2, 3]);
}

#[test]
fn plan_ddp_is_judged_on_the_smallest_gpu() {
    let out =
        vramplan(&["plan", "llama-3.2-1b", "--hardware", "a10g+t4", "--mode", "train", "--parallel", "ddp"]);
    assert_eq!(out.code, 1, "{}\n{}", out.stdout, out.stderr);
    assert!(out.stdout.contains("does not fit: the step runs out of memory on GPU 1"), "{}", out.stdout);
    for refused in [&["--target", "pipeline"][..], &["--pin", "lm_head=0"][..], &["--min-devices"][..]] {
        let args = [
            &["plan", "llama-3.2-1b", "--hardware", "2xa10g", "--mode", "train", "--parallel", "ddp"][..],
            refused,
        ]
        .concat();
        assert_refused(&vramplan(&args), &[refused[0]]);
    }
}

#[test]
fn check_ddp_checks_each_replica_on_its_own_gpu() {
    let dir = tempfile::tempdir().unwrap();
    let rank_map = write(dir.path(), "rank.json", r#"{"": 0}"#);
    let args = |hw: &'static str| {
        vec![
            "check",
            rank_map.as_str(),
            "llama-3.2-1b",
            "--hardware",
            hw,
            "--mode",
            "train",
            "--parallel",
            "ddp",
            "--json",
        ]
    };
    // Two A10Gs: each replica fits.
    let fits = vramplan(&args("2xa10g"));
    assert_eq!(fits.code, 0, "{}\n{}", fits.stdout, fits.stderr);
    let json = fits.json();
    assert_eq!(json["ok"], true);
    assert_eq!(ids(&json), vec![0, 1]);
    // An A10G and a T4: the replica runs out on the T4 only; the map itself is fine.
    let mixed = vramplan(&args("a10g+t4"));
    assert_eq!(mixed.code, 1, "{}", mixed.stderr);
    let json = mixed.json();
    assert_eq!(json["findings"], serde_json::json!([]));
    assert_eq!(json["fits"], false);
    assert_eq!(json["devices"][0]["fits"], true);
    assert_eq!(json["devices"][1]["fits"], false);
    assert_eq!(json["devices"][1]["name"], "Tesla T4");
}

#[test]
fn check_ddp_flags_a_map_of_more_than_one_entry() {
    let dir = tempfile::tempdir().unwrap();
    let mut entries = vec![r#""model.embed_tokens": 0"#.to_string()];
    for i in 0..16 {
        entries.push(format!(r#""model.layers.{i}": {}"#, if i < 8 { 0 } else { 1 }));
    }
    entries.extend([
        r#""model.norm": 1"#.into(),
        r#""model.rotary_emb": 1"#.into(),
        r#""lm_head": 0"#.into(),
    ]);
    let split = write(dir.path(), "split.json", format!("{{{}}}", entries.join(", ")));
    let ddp = ["llama-3.2-1b", "--hardware", "2xa10g", "--mode", "train", "--parallel", "ddp", "--json"];
    let out = vramplan(&[&["check", split.as_str()][..], &ddp].concat());
    assert_eq!(out.code, 1, "{}", out.stderr);
    let json = out.json();
    let rules: Vec<&str> =
        json["findings"].as_array().unwrap().iter().map(|f| f["rule"].as_str().unwrap()).collect();
    assert!(rules.contains(&"data-parallel-map"), "{rules:?}");
    assert!(json["memory_skipped"].is_string(), "{json}");
    // Listed one by one on one GPU: accelerate still counts the entries; memory is simulated.
    let listed = write(dir.path(), "listed.json", r#"{"model": 0, "lm_head": 0}"#);
    let out = vramplan(&[&["check", listed.as_str()][..], &ddp].concat());
    assert_eq!(out.code, 1, "{}", out.stderr);
    let json = out.json();
    let finding = &json["findings"][0];
    assert_eq!(finding["rule"], "data-parallel-map");
    assert!(finding["message"].as_str().unwrap().contains("{\"\": 0}"), "{finding}");
    assert_eq!(ids(&json), vec![0, 1]);
    // ZeRO-3 / FSDP take no map at all.
    let rank_map = write(dir.path(), "rank.json", r#"{"": 0}"#);
    let out = vramplan(&[
        "check",
        &rank_map,
        "llama-3.2-1b",
        "--hardware",
        "2xa10g",
        "--mode",
        "train",
        "--parallel",
        "zero3",
    ]);
    assert_refused(&out, &["--parallel", "DeepSpeed Zero-3 is not compatible", "vramplan estimate"]);
}
