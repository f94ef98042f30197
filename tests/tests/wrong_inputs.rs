//! Inputs that used to be read some other way than meant (issue 10, item 4): each is refused
//! with exit code 2, a message naming the flag or file and the key, and the fix; the valid
//! spellings beside them still work.

use std::path::Path;
use vramplan_tests::{Output, assert_bad_input, assert_refused, vramplan, write};

fn assert_ok(out: &Output) {
    assert_eq!(out.code, 0, "stdout:\n{}\nstderr:\n{}", out.stdout, out.stderr);
}

fn plan(extra: &[&str]) -> Output {
    let mut args = vec!["plan", "llama-2-7b", "--hardware", "t4x2"];
    args.extend_from_slice(extra);
    vramplan(&args)
}

// --headroom

#[test]
fn a_bare_headroom_of_one_or_more_is_refused_with_both_spellings() {
    assert_refused(&plan(&["--headroom", "2"]), &["--headroom", "`2`", "write `2%`", "`0.02`"]);
    assert_refused(&plan(&["--headroom", "1"]), &["--headroom", "write `1%`", "`0.01`"]);
    assert_refused(&plan(&["--headroom", "95%"]), &["--headroom", "0 to 90 %"]);
    assert_refused(&plan(&["--headroom", "nan"]), &["--headroom", "`nan`"]);
}

#[test]
fn a_headroom_as_percent_or_share_below_one_is_one_figure() {
    let percent = plan(&["--headroom", "10%", "--json"]);
    let share = plan(&["--headroom", "0.1", "--json"]);
    assert_ok(&percent);
    assert_ok(&share);
    let (percent, share) = (percent.json(), share.json());
    let limit = |v: &serde_json::Value| v["devices"][0]["limit_bytes"].as_u64().unwrap();
    assert_eq!(limit(&percent), limit(&share), "`10%` and `0.1` are the same headroom");
    assert_eq!(percent["device_map"], share["device_map"]);
    let wider = plan(&["--headroom", "20%", "--json"]);
    assert_ok(&wider);
    assert!(limit(&wider.json()) < limit(&percent), "20 % keeps more free than 10 %");
}

// --pin

#[test]
fn a_reversed_pin_range_is_refused() {
    let out = plan(&["--pin", "model.layers.5-2=0"]);
    assert_refused(&out, &["--pin", "model.layers.5-2", "backwards", "write `model.layers.2-5=0`"]);
}

#[test]
fn a_pin_range_past_the_last_layer_names_the_layer_count() {
    let out = plan(&["--pin", "model.layers.0-99=0"]);
    assert_refused(&out, &["--pin", "model.layers.0-99", "32 layers", "write `model.layers.0-31=0`"]);
}

#[test]
fn two_pins_of_one_module_are_refused_naming_both() {
    let out = plan(&["--pin", "lm_head=0", "--pin", "lm_head=1"]);
    assert_refused(&out, &["--pin", "`lm_head` is pinned twice", "GPU 0", "GPU 1"]);
    let out = plan(&["--pin", "model.layers.0-3=0", "--pin", "model.layers.2=1"]);
    assert_refused(&out, &["`model.layers.2` is pinned twice", "`model.layers.0-3`", "`model.layers.2`"]);
}

#[test]
fn a_pin_to_a_gpu_the_profile_lacks_names_the_gpus() {
    let out = plan(&["--pin", "lm_head=7"]);
    assert_refused(
        &out,
        &["--pin", "key `lm_head`", "GPU 7 is not in the hardware profile", "GPUs 0 to 1", "GPU 0 or 1"],
    );
    assert!(!out.stderr.contains("Gpu(7)"), "{}", out.stderr);
    let out = plan(&["--pin", "lm_head=cpu", "--no-offload"]);
    assert_refused(&out, &["--pin", "no cpu", "--no-offload"]);
}

#[test]
fn pins_against_the_layer_order_say_why() {
    // A pipeline runs its stages in order: pins out of it are refused, with the rule.
    let pipeline = |extra: &[&str]| plan(&[&["--target", "pipeline"][..], extra].concat());
    let out = pipeline(&["--pin", "model.layers.2=1", "--pin", "model.layers.5=0"]);
    assert_refused(&out, &["--pin", "key `model.layers.5`", "runs after `model.layers.2`", "in order"]);
    // The head runs last: pinned to GPU 0, the whole model would have to fit there.
    let out = pipeline(&["--pin", "lm_head=0"]);
    assert_refused(&out, &["--pin", "key `lm_head`", "every unit before it", "GPU 0", "a later device"]);
    // The first layer on GPU 1 leaves every later layer to GPU 1 alone without offload.
    let out = pipeline(&["--pin", "model.layers.0=1", "--no-offload"]);
    assert_refused(&out, &["--pin", "every unit after it", "an earlier device"]);
}

/// accelerate runs a module wherever the map puts it (its hooks move the hidden states there
/// and back), so pins against the layer order are honoured: Llama-2-70B's head on GPU 0 of 8
/// A100-40GB, after layers on GPU 7, as the user asked; the units not pinned keep the
/// order. The map is the one accelerate loads: every module on one device.
#[test]
fn accelerate_takes_pins_against_the_layer_order() {
    let out = vramplan(&["plan", "llama-2-70b", "--hardware", "8xa100-40gb", "--pin", "lm_head=0", "--json"]);
    assert_ok(&out);
    let map = out.json()["device_map"].as_object().expect("a map").clone();
    assert_eq!(map["lm_head"], 0, "{map:?}");
    let layer = |i: u32| map[&format!("model.layers.{i}")].as_u64().expect("a GPU");
    assert!((1..80).all(|i| layer(i - 1) <= layer(i)), "the layers stay in order: {map:?}");
    assert!(layer(79) > 0, "the layers do not all crowd GPU 0: {map:?}");
    let out = plan(&["--pin", "model.layers.2=1", "--pin", "model.layers.5=0", "--json"]);
    assert_ok(&out);
    let map = &out.json()["device_map"];
    assert_eq!((map["model.layers.2"].as_u64(), map["model.layers.5"].as_u64()), (Some(1), Some(0)), "{map}");
    // A tied head pinned to the last GPU takes its embedding along (one tensor, one device), and
    // neither holds the layers to the GPUs after it.
    let out =
        vramplan(&["plan", "llama-3.2-1b", "--hardware", "4xa100-40gb", "--pin", "lm_head=3", "--json"]);
    assert_ok(&out);
    let map = &out.json()["device_map"];
    assert_eq!((map["lm_head"].as_u64(), map["model.embed_tokens"].as_u64()), (Some(3), Some(3)), "{map}");
    assert!(map["model.layers.0"].as_u64().is_some_and(|g| g < 3), "{map}");
}

#[test]
fn tied_weights_pinned_apart_are_refused() {
    let out =
        vramplan(&["plan", "gpt2", "--hardware", "t4x2", "--pin", "transformer.wte=0", "--pin", "lm_head=1"]);
    assert_refused(&out, &["--pin", "tied weights", "`transformer.wte`", "`lm_head`"]);
}

#[test]
fn a_correct_pin_is_honoured() {
    let out = plan(&["--pin", "model.layers.20-31=1", "--json"]);
    assert_ok(&out);
    let map = &out.json()["device_map"];
    assert_eq!(map["model.layers.20"], 1, "{map}");
    assert_eq!(map["model.layers.31"], 1, "{map}");
}

// --expert-load

fn expert_plan(load: &str) -> Output {
    vramplan(&[
        "plan",
        "mixtral-8x7b",
        "--hardware",
        "a100-80gb-x4",
        "--target",
        "expert-parallel",
        "--expert-load",
        load,
    ])
}

/// Mixtral's 32 MoE layers of 8 experts, with `edit` applied to the entries.
fn expert_loads(edit: impl FnOnce(&mut serde_json::Map<String, serde_json::Value>)) -> String {
    let mut map = serde_json::Map::new();
    for layer in 0..32 {
        let loads: Vec<u32> = (0..8).map(|e| 100 + 10 * e + layer).collect();
        map.insert(format!("model.layers.{layer}.mlp.experts"), serde_json::json!(loads));
    }
    edit(&mut map);
    serde_json::to_string_pretty(&map).unwrap()
}

#[test]
fn a_correct_expert_load_is_used() {
    let dir = tempfile::tempdir().unwrap();
    let file = write(dir.path(), "load.json", expert_loads(|_| {}));
    assert_ok(&expert_plan(&file));
}

#[test]
fn an_expert_load_of_the_wrong_length_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let text = expert_loads(|m| {
        m.insert("model.layers.3.mlp.experts".into(), serde_json::json!([1, 2, 3]));
    });
    let out = expert_plan(&write(dir.path(), "load.json", &text));
    assert_bad_input(
        &out,
        &["load.json:", "`model.layers.3.mlp.experts` has 3 loads", "8 routed experts", "give 8"],
    );
}

#[test]
fn an_expert_load_missing_a_layer_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let text = expert_loads(|m| {
        m.remove("model.layers.7.mlp.experts");
    });
    let out = expert_plan(&write(dir.path(), "load.json", &text));
    assert_refused(&out, &["load.json", "1 of the 32 MoE layers", "model.layers.7.mlp.experts"]);
}

#[test]
fn negative_or_non_finite_expert_loads_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let text = expert_loads(|m| {
        m.insert("model.layers.4.mlp.experts".into(), serde_json::json!([1, 2, 3, -4, 5, 6, 7, 8]));
    });
    let out = expert_plan(&write(dir.path(), "negative.json", &text));
    assert_refused(&out, &["negative.json:", "`model.layers.4.mlp.experts`[3] is -4", "≥ 0"]);
    // JSON has no infinity: an overflowing number is where a non-finite load would come from.
    let text = expert_loads(|_| {}).replacen("100", "1e999", 1);
    let out = expert_plan(&write(dir.path(), "infinite.json", &text));
    assert_refused(&out, &["infinite.json:", "out of range"]);
}

#[test]
fn an_expert_load_for_an_unknown_layer_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let text = expert_loads(|m| {
        m.insert("model.layers.40.mlp.experts".into(), serde_json::json!([1, 1, 1, 1, 1, 1, 1, 1]));
    });
    let out = expert_plan(&write(dir.path(), "load.json", &text));
    assert_bad_input(
        &out,
        &["`model.layers.40.mlp.experts` is not a MoE layer", "model.layers.0.mlp.experts"],
    );
}

#[test]
fn an_expert_load_on_a_dense_model_or_a_layer_target_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let file = write(dir.path(), "load.json", expert_loads(|_| {}));
    let out = plan(&["--expert-load", &file]);
    assert_refused(&out, &["--expert-load", "dense model", "leave out --expert-load"]);
    let out = vramplan(&["plan", "mixtral-8x7b", "--hardware", "a100-80gb-x4", "--expert-load", &file]);
    assert_refused(&out, &["--expert-load", "--target accelerate", "--target expert-parallel"]);
}

/// A layer's loads written twice: JSON readers keep the last list silently; refused at the
/// second entry's line.
#[test]
fn an_expert_load_listed_twice_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let text = expert_loads(|_| {});
    let twice = text.replacen("{\n", "{\n  \"model.layers.5.mlp.experts\": [1, 1, 1, 1, 1, 1, 1, 1],\n", 1);
    let out = expert_plan(&write(dir.path(), "twice.json", &twice));
    assert_bad_input(&out, &["twice.json:", "`model.layers.5.mlp.experts` is listed twice", "once"]);
}

// estimate --plan

fn written_plan(dir: &Path) -> String {
    let path = dir.join("plan.yaml").display().to_string();
    assert_ok(&plan(&["-o", &path]));
    path
}

#[test]
fn a_plan_file_is_read_back_for_its_model() {
    let dir = tempfile::tempdir().unwrap();
    let path = written_plan(dir.path());
    assert_ok(&vramplan(&["estimate", "llama-2-7b", "--hardware", "t4x2", "--plan", &path]));
}

#[test]
fn a_plan_file_for_another_model_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let path = written_plan(dir.path());
    let out = vramplan(&["estimate", "llama-3-8b", "--hardware", "t4x2", "--plan", &path]);
    assert_refused(&out, &["plan.yaml", "key `model`", "written for `llama-2-7b`, not `llama-3-8b`"]);
    let out = vramplan(&["estimate", "gpt2", "--hardware", "t4x2", "--plan", &path]);
    assert_refused(&out, &["key `model`", "vramplan plan gpt2"]);
}

#[test]
fn a_plan_file_of_an_unknown_version_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let path = written_plan(dir.path());
    let text = std::fs::read_to_string(&path).unwrap();
    assert!(text.starts_with("vramplan_plan: 1\n"), "{text}");
    let newer = write(dir.path(), "newer.yaml", text.replacen("vramplan_plan: 1", "vramplan_plan: 2", 1));
    let out = vramplan(&["estimate", "llama-2-7b", "--hardware", "t4x2", "--plan", &newer]);
    assert_refused(&out, &["newer.yaml:1:", "`vramplan_plan: 2`", "version 1", "vramplan plan"]);
    let none = write(dir.path(), "none.yaml", text.trim_start_matches("vramplan_plan: 1\n"));
    let out = vramplan(&["estimate", "llama-2-7b", "--hardware", "t4x2", "--plan", &none]);
    assert_refused(&out, &["none.yaml", "key `vramplan_plan`"]);
}

/// A plan file's map is read as `--device-map` reads a map: an empty map (of a plan that places
/// one copy), a name the model lacks and a target no runtime has are refused, in `estimate`,
/// `report` and `plot` alike, where they used to "fit on 0 GPUs" or be taken as given.
#[test]
fn a_plan_files_map_and_target_are_checked_as_a_device_map_is() {
    let dir = tempfile::tempdir().unwrap();
    let path = written_plan(dir.path());
    let text = std::fs::read_to_string(&path).unwrap();
    let at = text.find("device_map:").expect("a map");
    let empty = write(dir.path(), "empty.yaml", format!("{}device_map: {{}}\n", &text[..at]));
    let unknown = write(
        dir.path(),
        "unknown.yaml",
        text.replacen("device_map:\n", "device_map:\n  model.layers.99: 0\n", 1),
    );
    let target =
        write(dir.path(), "target.yaml", text.replacen("target: accelerate", "target: tensorflow", 1));
    let base = ["llama-2-7b", "--hardware", "t4x2", "--plan"];
    for (file, says) in [
        (&empty, &["empty.yaml", "key `device_map`", "empty"][..]),
        (&unknown, &["unknown.yaml", "key `device_map.model.layers.99`", "not a module"][..]),
        (&target, &["target.yaml:", "unknown target `tensorflow`"][..]),
    ] {
        assert_bad_input(&vramplan(&[&["estimate"][..], &base, &[file.as_str()]].concat()), says);
        let report = dir.path().join("r.md").display().to_string();
        assert_bad_input(
            &vramplan(&[&["report"][..], &base, &[file.as_str(), "-o", &report]].concat()),
            says,
        );
        let png = dir.path().join("p.png").display().to_string();
        assert_bad_input(
            &vramplan(&[&["plot", "breakdown"][..], &base, &[file.as_str(), "-o", &png]].concat()),
            says,
        );
    }
}

// profiles --json

#[test]
fn profiles_show_takes_json_before_or_after_the_name() {
    let after = vramplan(&["profiles", "show", "t4", "--json"]);
    let before = vramplan(&["profiles", "--json", "show", "t4"]);
    assert_ok(&after);
    assert_ok(&before);
    assert_eq!(after.json()["name"], "t4");
    assert_eq!(after.stdout, before.stdout);
    let yaml = vramplan(&["profiles", "show", "t4"]);
    assert_ok(&yaml);
    assert!(yaml.stdout.contains("name: \"t4\""), "{}", yaml.stdout);
}

/// Flags the workload does not read are refused, not ignored: training flags in inference, and
/// transformers' own under a serving engine.
#[test]
fn flags_that_do_not_apply_are_refused() {
    let base = ["estimate", "llama-3.2-1b", "--hardware", "a100-80gb"];
    let cases: [(&[&str], &[&str]); 4] = [
        (
            &["--mode", "inference", "--grad-ckpt", "full"],
            &["--grad-ckpt", "applies to training", "--mode train"],
        ),
        (&["--engine", "vllm", "--trainer", "unsloth"], &["--trainer", "applies to training"]),
        (&["--mode", "inference", "--optimizer", "sgd"], &["--optimizer", "applies to training"]),
        (&["--engine", "vllm", "--attn", "eager"], &["--attn", "--engine vllm runs it its own way"]),
    ];
    for (extra, says) in cases {
        let out = vramplan(&[&base[..], extra].concat());
        assert_bad_input(&out, says);
    }
    assert_ok(&vramplan(&[&base[..], &["--mode", "train", "--grad-ckpt", "full"]].concat()));
}
