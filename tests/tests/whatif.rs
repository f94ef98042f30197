//! `vramplan whatif` against answers it does not compute itself: brute-force scans of `vramplan
//! estimate` and `vramplan plan` (the boundary, and the value past it that must not fit), closed
//! forms from the published config and checkpoint index, vLLM's own logged KV capacity, the
//! remedy `plan` offers today, and the seed scenarios of the issue, one command each.

use vramplan_tests::{Output, assert_refused, shared_dir, shared_model, vramplan};

fn whatif(args: &[&str]) -> Output {
    let out = vramplan(&[&["whatif"], args].concat());
    assert!(out.code <= 1, "whatif {args:?}:\n{}\n{}", out.stdout, out.stderr);
    out
}

/// `vramplan estimate` with `extra` over `base`: whether it fits (exit 0) or not (exit 1).
fn estimate_fits(base: &[&str], extra: &[&str]) -> bool {
    let out = vramplan(&[&["estimate"], base, extra].concat());
    assert!(out.code <= 1, "estimate {base:?} {extra:?}:\n{}", out.stderr);
    out.code == 0
}

/// `vramplan plan` judged as whatif judges (no headroom, GPUs only): whether a map that fits
/// was found (exit 0; 1 is proven not to, 4 none found).
fn plan_fits(base: &[&str], extra: &[&str]) -> bool {
    let out = vramplan(&[&["plan"], base, extra, &["--headroom", "0", "--no-offload"]].concat());
    assert!(matches!(out.code, 0 | 1 | 4), "plan {base:?} {extra:?}:\n{}", out.stderr);
    out.code == 0
}

fn value(out: &Output, key: &str) -> u64 {
    out.json()[key].as_u64().unwrap_or_else(|| panic!("no `{key}` in {}", out.stdout))
}

#[test]
fn max_batch_is_the_last_batch_a_scan_of_estimate_fits() {
    let cases: [&[&str]; 3] = [
        &["gpt2", "--hardware", "t4", "--mode", "train", "--seq", "1024"],
        &["pythia-410m", "--hardware", "t4", "--mode", "train", "--seq", "2048", "--dtype", "fp16"],
        &["qwen2.5-0.5b", "--hardware", "rtx4090", "--mode", "train", "--lora-rank", "8", "--seq", "1024"],
    ];
    for base in cases {
        let answer = value(&whatif(&[&["max-batch"], base, &["--json"]].concat()), "value");
        // Every batch up to the answer fits, the next does not.
        for b in 1..=answer + 1 {
            let fits = estimate_fits(base, &["--batch", &b.to_string()]);
            assert_eq!(fits, b <= answer, "{base:?} batch {b} (answer {answer})");
        }
    }
}

#[test]
fn the_time_series_transformer_on_a_4090_at_256_and_512() {
    let model = format!("{}/../docs/examples/timeseries-transformer.yaml", env!("CARGO_MANIFEST_DIR"));
    // Its 512 positions are a learned table: a longer sequence is refused, not estimated.
    let past = vramplan(&[
        "whatif",
        "max-batch",
        &model,
        "--hardware",
        "rtx4090",
        "--mode",
        "train",
        "--seq",
        "2048",
    ]);
    assert_refused(&past, &["learned table of 512 positions", "--seq 512"]);
    for seq in ["256", "512"] {
        let base = [model.as_str(), "--hardware", "rtx4090", "--mode", "train", "--seq", seq];
        let out = whatif(&[&["max-batch"], &base[..], &["--json"]].concat());
        let answer = value(&out, "value");
        assert_eq!(value(&out, "next"), answer + 1);
        assert!(estimate_fits(&base, &["--batch", &answer.to_string()]), "seq {seq}: {answer} must fit");
        assert!(
            !estimate_fits(&base, &["--batch", &(answer + 1).to_string()]),
            "seq {seq}: one more must not"
        );
        let binding = &out.json()["binding"];
        assert_eq!(binding["component"], "activations", "seq {seq}: {binding}");
    }
}

#[test]
fn max_seq_is_the_last_length_estimate_fits() {
    let base = ["qwen2.5-0.5b", "--hardware", "t4", "--mode", "train"];
    let out = whatif(&[&["max-seq"], &base[..], &["--past-positions", "--json"]].concat());
    let answer = value(&out, "value");
    for seq in [answer / 4, answer / 2, answer - 1, answer] {
        assert!(estimate_fits(&base, &["--seq", &seq.to_string()]), "seq {seq} (answer {answer}) must fit");
    }
    assert!(!estimate_fits(&base, &["--seq", &(answer + 1).to_string()]));
    // GPT-2's 1,024 positions bind before a T4's memory does, and the answer says so.
    let capped = whatif(&["max-seq", "gpt2", "--hardware", "t4", "--mode", "train", "--json"]).json();
    assert_eq!(capped["cap"], serde_json::json!({"cap": "positions", "value": 1024}));
    assert_eq!(capped["value"].as_u64(), Some(1024));
    assert!(estimate_fits(&["gpt2", "--hardware", "t4", "--mode", "train"], &["--seq", "1024"]));
}

/// Closed form from the published checkpoint and config: a batch of `seq`-token contexts
/// whose KV cache and weights fill the GPU's usable memory, with a short prompt so that prefill
/// adds little. The simulated answer must sit at or just under it.
#[test]
fn inference_batch_meets_the_kv_cache_closed_form() {
    let folder = shared_dir().join("models/meta-llama__Meta-Llama-3-8B");
    let index: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(folder.join("model.safetensors.index.json")).unwrap())
            .unwrap();
    let config: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(folder.join("config.json")).unwrap()).unwrap();
    let weights = index["metadata"]["total_size"].as_u64().unwrap();
    let n = |k: &str| config[k].as_u64().unwrap();
    let head_dim = n("hidden_size") / n("num_attention_heads");
    let seq = 8192;
    // K and V, every layer, in bf16.
    let kv_per_sequence = seq * 2 * n("num_hidden_layers") * n("num_key_value_heads") * head_dim * 2;
    let model = shared_model("meta-llama__Meta-Llama-3-8B");
    let base = [model.as_str(), "--hardware", "h100-80gb", "--seq", "8192", "--prompt", "128"];
    let usable =
        vramplan(&[&["estimate"], &base[..], &["--json"]].concat()).json()["devices"][0]["usable_bytes"]
            .as_u64()
            .unwrap();
    let bound = (usable - weights) / kv_per_sequence;
    let answer = value(&whatif(&[&["max-batch"], &base[..], &["--json"]].concat()), "value");
    assert!(answer <= bound && bound - answer <= 2, "answer {answer}, closed form {bound}");
}

/// vLLM 0.19 logged 476,016 KV-cache tokens for Llama-3.1-8B on one H100 at
/// `--gpu-memory-utilization 0.95` (fixtures/published/measurements/measured.csv,
/// `vllm019_llama31_8b_tp1`): its "maximum concurrency" for 8,192-token requests is that over
/// 8,192.
#[test]
fn vllm_concurrency_matches_vllms_own_log() {
    let csv = std::fs::read_to_string(shared_dir().join("measurements/measured.csv")).unwrap();
    let row = csv.lines().find(|l| l.starts_with("vllm019_llama31_8b_tp1,")).expect("the row");
    let tokens: u64 = row
        .split("kv_cache_tokens=")
        .nth(1)
        .unwrap()
        .split(|c: char| !c.is_ascii_digit())
        .next()
        .unwrap()
        .parse()
        .unwrap();
    let measured = tokens / 8192;
    let out = whatif(&[
        "max-concurrency",
        "llama-3.1-8b",
        "--hardware",
        "h100-80gb",
        "--seq",
        "8192",
        "--engine",
        "vllm",
        "--gpu-memory-utilization",
        "0.95",
        "--json",
    ]);
    let answers = out.json();
    let vllm = answers.as_array().unwrap().iter().find(|a| a["engine"] == "vllm").unwrap();
    let ours = vllm["sequences"].as_u64().unwrap();
    assert!(ours.abs_diff(measured) <= 1, "ours {ours}, vLLM's log {measured} ({tokens} tokens)");
    // transformers' figure is its own max-batch at that length.
    let transformers = answers.as_array().unwrap().iter().find(|a| a["engine"] == "transformers").unwrap();
    let batch = value(
        &whatif(&["max-batch", "llama-3.1-8b", "--hardware", "h100-80gb", "--seq", "8192", "--json"]),
        "value",
    );
    assert_eq!(transformers["sequences"].as_u64(), Some(batch));
}

#[test]
fn min_gpus_is_the_first_count_a_plan_fits() {
    // The seed: Mixtral-8x7B in nf4 at an 8k context on T4s. transformers 4.x quantizes every
    // expert (nn.Linear); 5.x keeps its fused experts in the load dtype (docs/memory-model.md).
    for (target, naming) in [("accelerate-v4", "v4"), ("accelerate", "v5")] {
        let out = whatif(&[
            "min-gpus",
            "mixtral-8x7b",
            "--hardware",
            "t4",
            "--quant",
            "nf4",
            "--seq",
            "8192",
            "--target",
            target,
            "--json",
        ]);
        let answer = value(&out, "gpus");
        let hw = |n: u64| format!("{n}xt4");
        let base = |n: u64| {
            [
                "mixtral-8x7b".to_string(),
                "--hardware".into(),
                hw(n),
                "--quant".into(),
                "nf4".into(),
                "--seq".into(),
                "8192".into(),
                "--target".into(),
                target.into(),
            ]
        };
        for n in 1..=answer {
            let args = base(n);
            let args: Vec<&str> = args.iter().map(String::as_str).collect();
            assert_eq!(plan_fits(&args, &[]), n == answer, "{naming}: {n} T4s (answer {answer})");
        }
        assert_eq!(out.json()["hardware"], hw(answer));
    }
}

#[test]
fn best_quant_is_the_first_precision_estimate_fits() {
    let base = ["llama-3-70b", "--hardware", "a100-80gb", "--seq", "4096"];
    let out = whatif(&[&["best-quant"], &base[..], &["--json"]].concat());
    let choices = out.json();
    let flags = |q: &serde_json::Value| match q["kind"].as_str().unwrap() {
        "none" => vec!["--quant", "none"],
        "int8" => vec!["--quant", "int8"],
        "nf4" => vec!["--quant", "nf4", "--double-quant"],
        other => panic!("unexpected {other}"),
    };
    let mut first = None;
    for c in choices.as_array().unwrap() {
        let fits = estimate_fits(&base, &flags(&c["quant"]));
        assert_eq!(c["fit"]["fits"].as_bool(), Some(fits), "{}", c["quant"]);
        if fits && first.is_none() {
            first = Some(c["quant"]["kind"].clone());
        }
    }
    assert_eq!(first.as_ref().and_then(|f| f.as_str()), Some("int8"));
}

#[test]
fn cheapest_is_the_lowest_priced_profile_that_plans() {
    // The seed: Llama-3-8B QLoRA at batch 4 × 2048, over every built-in profile.
    let base = [
        "llama-3-8b",
        "--mode",
        "train",
        "--quant",
        "nf4",
        "--lora-rank",
        "16",
        "--batch",
        "4",
        "--seq",
        "2048",
    ];
    let out = whatif(&[&["cheapest"], &base[..], &["--hardware", "all", "--json"]].concat());
    let answer = out.json();
    let prices = std::fs::read_to_string(format!(
        "{}/../profiles/catalog/hardware/prices.yaml",
        env!("CARGO_MANIFEST_DIR")
    ))
    .unwrap();
    // The price per GPU-hour of a catalog key, read off the table's text.
    let price = |key: &str| -> f64 {
        let at = prices.find(&format!("\n  {key}:\n")).unwrap();
        let line = prices[at..].lines().find(|l| l.trim_start().starts_with("per_gpu_hour:")).unwrap();
        line.split(':').nth(1).unwrap().trim().parse().unwrap()
    };
    let mut best: Option<(f64, String)> = None;
    for row in answer["profiles"].as_array().unwrap() {
        let hw = row["hardware"].as_str().unwrap();
        let profile = vramplan(&["profiles", "show", hw, "--json"]).json();
        let cost: f64 =
            profile["devices"].as_array().unwrap().iter().map(|d| price(d["model"].as_str().unwrap())).sum();
        assert!((row["per_hour"].as_f64().unwrap() - cost).abs() < 1e-9, "{hw}");
        let fits = plan_fits(&[&base[..], &["--hardware", hw]].concat(), &[]);
        assert_eq!(row["fit"]["fits"].as_bool(), Some(fits), "{hw}");
        if fits && best.as_ref().is_none_or(|(c, _)| cost < *c) {
            best = Some((cost, hw.to_string()));
        }
    }
    assert_eq!(answer["answer"].as_str(), best.map(|(_, h)| h).as_deref());
}

/// The remedy `plan` offers for a batch that does not fit (a smaller batch, verified by
/// re-solving at the plan's 10 % headroom) is whatif's max-batch at the same headroom.
#[test]
fn the_plan_remedy_and_max_batch_agree() {
    let base = ["gpt2", "--hardware", "t4", "--mode", "train", "--seq", "1024"];
    let planned = vramplan(&[&["plan"], &base[..], &["--batch", "32", "--json"]].concat());
    assert_eq!(planned.code, 1, "{}", planned.stderr);
    let remedies = planned.json()["explanation"]["remedies"].clone();
    let remedy = remedies
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["change"]["change"] == "batch")
        .expect("a batch remedy");
    let answer =
        value(&whatif(&[&["max-batch"], &base[..], &["--headroom", "10%", "--json"]].concat()), "value");
    assert_eq!(remedy["change"]["batch"].as_u64(), Some(answer));
}

#[test]
fn pythia_lora_on_kaggle_t4x2_longest_sequence() {
    let base = [
        "pythia-2.8b",
        "--hardware",
        "t4x2",
        "--mode",
        "train",
        "--lora-rank",
        "16",
        "--dtype",
        "fp16",
        "--grad-ckpt",
        "full",
    ];
    let out = whatif(&[&["max-seq"], &base[..], &["--past-positions", "--json"]].concat());
    let answer = value(&out, "value");
    assert!(plan_fits(&base, &["--seq", &answer.to_string()]));
    assert!(!plan_fits(&base, &["--seq", &(answer + 1).to_string()]));
    // The answer's map, as written to run it, is the map that fits.
    assert!(out.json()["run"][0]["device_map"].is_object(), "{}", out.stdout);
}

#[test]
fn grid_points_are_estimates() {
    let out = whatif(&[
        "grid",
        "gpt2",
        "--hardware",
        "t4,rtx4090",
        "--mode",
        "train",
        "--batch",
        "1..16",
        "--seq",
        "512,1024",
        "--csv",
    ]);
    let mut lines = out.stdout.lines();
    assert_eq!(lines.next(), Some("batch,seq,hardware,fits,peak_bytes,utilisation,binding"));
    let rows: Vec<Vec<&str>> = lines.map(|l| l.split(',').collect()).collect();
    assert_eq!(rows.len(), 5 * 2 * 2);
    for row in rows {
        let (batch, seq, hw, fits) = (row[0], row[1], row[2], row[3] == "true");
        let est = vramplan(&[
            "estimate",
            "gpt2",
            "--hardware",
            hw,
            "--mode",
            "train",
            "--batch",
            batch,
            "--seq",
            seq,
            "--json",
        ]);
        assert_eq!(est.code == 0, fits, "{row:?}");
        assert_eq!(est.json()["peak_bytes"].as_u64().unwrap().to_string(), row[4], "{row:?}");
    }
}

#[test]
fn bad_whatif_input_is_refused_with_a_fix() {
    assert_refused(&vramplan(&["whatif", "grid", "gpt2", "--hardware", "t4"]), &["no axis to sweep"]);
    assert_refused(
        &vramplan(&["whatif", "grid", "gpt2", "--hardware", "t4", "--batch", "8..4"]),
        &["--batch", "runs backwards"],
    );
    assert_refused(
        &vramplan(&["whatif", "max-batch", "gpt2", "--hardware", "t4,t4x2"]),
        &["--hardware", "cheapest"],
    );
    assert_refused(
        &vramplan(&["whatif", "max-batch", "gpt2", "--hardware", "t4", "--engine", "vllm"]),
        &["max-concurrency"],
    );
    assert_refused(&vramplan(&["whatif", "cheapest", "gpt2", "--hardware", "t4,,l4"]), &["empty profile"]);
    assert_refused(&vramplan(&["whatif", "max-batch", "gpt2", "--hardware", "t4", "--csv"]), &["--csv"]);
}

#[test]
fn frontier_points_are_boundaries_and_none_beats_another() {
    let out = whatif(&["frontier", "gpt2", "--hardware", "t4", "--csv"]);
    let rows: Vec<Vec<String>> =
        out.stdout.lines().skip(1).map(|l| l.split(',').map(String::from).collect()).collect();
    assert!(rows.len() >= 3, "{}", out.stdout);
    let quant_rank = |q: &str| ["none", "int8", "nf4 (double quant)"].iter().position(|x| *x == q).unwrap();
    for row in &rows {
        let (quant, offload, seq, batch) =
            (&row[0], row[3] == "true", &row[4], row[5].parse::<u64>().unwrap());
        let mut args = vec!["gpt2", "--hardware", "t4", "--seq", seq];
        match quant.as_str() {
            "none" => {}
            "int8" => args.extend(["--quant", "int8"]),
            _ => args.extend(["--quant", "nf4", "--double-quant"]),
        }
        let fits = |b: u64| {
            let b = b.to_string();
            if offload {
                // Layers may go to the CPU: a plan that allows it, judged at no headroom.
                let out = vramplan(&[&["plan"], &args[..], &["--batch", &b, "--headroom", "0"]].concat());
                out.code == 0
            } else {
                estimate_fits(&args, &["--batch", &b])
            }
        };
        assert!(fits(batch) && !fits(batch + 1), "{row:?}");
    }
    // No point is at least as good as another on every axis and better on one.
    let key = |r: &Vec<String>| {
        (r[5].parse::<u64>().unwrap(), r[4].parse::<u64>().unwrap(), quant_rank(&r[0]), r[3] == "true")
    };
    for a in &rows {
        for b in &rows {
            let (ab, aseq, aq, aoff) = key(a);
            let (bb, bseq, bq, boff) = key(b);
            let no_worse = ab >= bb && aseq >= bseq && aq <= bq && (!aoff || boff);
            let better = ab > bb || aseq > bseq || aq < bq || (!aoff && boff);
            assert!(!(no_worse && better), "{a:?} beats {b:?}");
        }
    }
}

/// vLLM runs on one GPU unless told (`--tensor-parallel-size` defaults to 1): on four A100s a
/// 70B model in bf16 (131 GiB of weights, more than one 80 GB GPU) is served only with tensor
/// parallelism, and the answer says so and runs it, where it used to answer 0 and blame
/// `--max-num-seqs`. The answer equals `estimate`'s KV capacity under `--parallel tp=4`.
#[test]
fn vllm_over_several_gpus_answers_with_the_tensor_parallelism_it_needs() {
    let base = ["llama-3.3-70b", "--hardware", "a100-80gb-x4", "--engine", "vllm", "--seq", "4096"];
    let out = whatif(&[&["max-concurrency"][..], &base, &["--json"]].concat());
    assert_eq!(out.code, 0, "{}", out.stderr);
    let answers: serde_json::Value = serde_json::from_str(&out.stdout).expect("JSON");
    let vllm = answers.as_array().and_then(|a| a.iter().find(|r| r["engine"] == "vllm")).expect("a vLLM row");
    assert_eq!(vllm["tensor_parallel"], 4, "{vllm}");
    let sequences = vllm["sequences"].as_u64().expect("sequences");
    let capacity = vllm["kv_capacity_tokens"].as_u64().expect("capacity");
    assert_eq!(sequences, capacity / 4096);
    let estimate = vramplan(&[&["estimate"][..], &base, &["--parallel", "tp=4", "--json"]].concat());
    assert_eq!(estimate.code, 0, "{}", estimate.stderr);
    assert!(
        estimate.stdout.contains(&format!("{capacity}")),
        "estimate under tp=4 holds {capacity} KV tokens"
    );
    let text = whatif(&[&["max-concurrency"][..], &base].concat());
    assert!(
        text.stdout.contains("--tensor-parallel-size 4") && text.stdout.contains("tp=4"),
        "{}",
        text.stdout
    );
}

/// SGLang too runs on one GPU unless told (`--tp-size` defaults to 1): its row widens to the
/// largest tensor-parallel size the four A100s allow, and holds what `estimate --engine sglang
/// --parallel tp=4` holds.
#[test]
fn sglang_over_several_gpus_answers_with_the_tensor_parallelism_it_needs() {
    let base = ["llama-3.3-70b", "--hardware", "a100-80gb-x4", "--engine", "sglang", "--seq", "4096"];
    let out = whatif(&[&["max-concurrency"][..], &base, &["--json"]].concat());
    let answers: serde_json::Value = serde_json::from_str(&out.stdout).expect("JSON");
    let row =
        answers.as_array().and_then(|a| a.iter().find(|r| r["engine"] == "sglang")).expect("an SGLang row");
    assert_eq!(row["tensor_parallel"], 4, "{row}");
    let capacity = row["kv_capacity_tokens"].as_u64().expect("capacity");
    let estimate = vramplan(&[&["estimate"][..], &base, &["--parallel", "tp=4", "--json"]].concat());
    assert_eq!(estimate.code, 0, "{}", estimate.stderr);
    assert_eq!(estimate.json()["kv_capacity_tokens"].as_u64(), Some(capacity), "{}", estimate.stdout);
}

/// `min-gpus` under vLLM answers with the tensor × pipeline shape each count runs as (tensor
/// parallel inside a server of 8, dividing the heads and the count; pipeline stages for the
/// rest), checked by `estimate` of that shape: Llama-3.1-405B (128 heads) at 32k × 8 on H100s.
#[test]
fn min_gpus_under_vllm_gives_the_tensor_by_pipeline_shape() {
    let base =
        ["llama-3.1-405b", "--mode", "inference", "--engine", "vllm", "--seq", "32768", "--batch", "8"];
    let out = whatif(&[&["min-gpus"][..], &base, &["--hardware", "h100-80gb", "--json"]].concat());
    let answer = out.json();
    let n = answer["gpus"].as_u64().expect("a count");
    let fewer = answer["fewer"].as_u64().expect("a count below");
    assert_eq!(fewer, n - 1);
    // The shape vLLM's guide gives each count: the largest tp ≤ 8 dividing the count that vLLM's
    // layers accept for Llama-3.1-405B's config (128 heads, 8 KV heads: `total_num_kv_heads % tp`
    // or `tp % total_num_kv_heads`, MLP 53248), the rest in pipeline stages.
    let shape = |n: u64| {
        let accepted = |tp: u64| 128 % tp == 0 && (8 % tp == 0 || tp.is_multiple_of(8)) && 53248 % tp == 0;
        let tp = (1..=n.min(8)).rev().find(|tp| accepted(*tp) && n.is_multiple_of(*tp)).expect("tp");
        if n / tp > 1 { format!("tp={tp},pp={}", n / tp) } else { format!("tp={tp}") }
    };
    assert_eq!(answer["parallel"], shape(n).as_str(), "{answer}");
    for (count, fits) in [(n, true), (fewer, false)] {
        let hardware = format!("{count}xh100-80gb");
        let layout = shape(count);
        assert_eq!(
            estimate_fits(&base, &["--hardware", &hardware, "--parallel", &layout]),
            fits,
            "{count}: {layout}"
        );
    }
    let text = whatif(&[&["min-gpus"][..], &base, &["--hardware", "h100-80gb"]].concat());
    let (tp, pp) =
        shape(n).split_once(',').map_or((shape(n), String::new()), |(t, p)| (t.to_string(), p.to_string()));
    assert!(text.stdout.contains(&format!("--tensor-parallel-size {}", &tp[3..])), "{}", text.stdout);
    if !pp.is_empty() {
        assert!(text.stdout.contains(&format!("--pipeline-parallel-size {}", &pp[3..])), "{}", text.stdout);
    }
}

/// A grid cut short by its time limit marks the points it did not answer as such, not as points
/// that do not fit (a plot would have drawn them as "×"), and exits 4.
#[test]
fn a_grid_cut_short_marks_its_unanswered_points() {
    let args = [
        "whatif",
        "grid",
        "llama-2-7b",
        "--hardware",
        "t4x2",
        "--batch",
        "1,2,4",
        "--seq",
        "512,1024",
        "--time-limit",
        "0.001",
    ];
    let out = vramplan(&[&args[..], &["--json"]].concat());
    assert_eq!(out.code, 4, "{}{}", out.stdout, out.stderr);
    let answer = out.json();
    let points = answer["points"].as_array().or_else(|| answer["grid"]["points"].as_array()).expect("points");
    let unanswered: Vec<&serde_json::Value> = points.iter().filter(|p| p["unanswered"] == true).collect();
    assert!(!unanswered.is_empty(), "{answer}");
    assert!(unanswered.iter().all(|p| p["fits"] == false && p.get("binding").is_none()), "{answer}");
    let text = vramplan(&args);
    assert!(
        text.stdout.contains("unanswered") && text.stdout.contains("not answered within the time limit"),
        "{}",
        text.stdout
    );
}
