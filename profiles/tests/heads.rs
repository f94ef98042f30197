//! Task heads in custom models: `head:` in a custom YAML that `extend`s a config builds the
//! family's base model or task-head class, whose names, shapes and dtypes must equal what the
//! real transformers builds (`fixtures/reference/heads/v5/<class>.json`, recorded by
//! `scripts/reference/heads.py`), and bad values are refused with the key's line and a fix.

use serde_json::Value;
use std::path::{Path, PathBuf};
use vramplan_profiles::model::{self, ImportOptions, ModelDescription, OutputHead, TensorKind};

fn write(dir: &Path, yaml: &str) -> PathBuf {
    let path = dir.join("model.yaml");
    std::fs::write(&path, yaml).expect("write");
    path
}

fn custom(yaml: &str) -> Result<ModelDescription, vramplan_profiles::InputError> {
    let dir = tempfile::tempdir().expect("temp dir");
    model::custom::load_file(&write(dir.path(), yaml), ImportOptions::default())
}

/// transformers' `named_parameters()` of `class` built from a built-in config (the fixture).
fn fixture_parameters(class: &str) -> Vec<(String, Vec<u64>)> {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join(format!("../fixtures/reference/heads/v5/{class}.json"));
    let fixture: Value =
        serde_json::from_str(&std::fs::read_to_string(&path).expect("fixture")).expect("JSON");
    fixture["parameters"]
        .as_array()
        .expect("parameters")
        .iter()
        .map(|p| (p[0].as_str().unwrap().to_string(), serde_json::from_value(p[1].clone()).unwrap()))
        .collect()
}

/// Our parameters, each tied group once, as `named_parameters()` lists them.
fn parameters(model: &ModelDescription) -> Vec<(String, Vec<u64>)> {
    model
        .tensors()
        .into_iter()
        .filter(|(_, t)| t.kind == TensorKind::Parameter && t.tied_to.is_none())
        .map(|(path, t)| (path, t.shape.clone()))
        .collect()
}

#[test]
fn a_custom_head_is_the_transformers_class() {
    let qa = custom("extend: xlnet-base-cased\nhead: question_answering\nmodules: []\n").expect("builds");
    assert_eq!(qa.architecture, "XLNetForQuestionAnswering");
    assert_eq!(parameters(&qa), fixture_parameters("XLNetForQuestionAnswering"));
    assert!(matches!(qa.facts.head, OutputHead::XlnetBeam { start_top: 5 }));
    assert!(!qa.custom, "with no modules of its own it is the transformers class");

    let base = custom("extend: xlnet-base-cased\nhead: none\nmodules: []\n").expect("builds");
    assert_eq!(base.architecture, "XLNetModel");
    assert_eq!(base.facts.head, OutputHead::None);
    assert!(base.tensors().iter().all(|(p, _)| !p.starts_with("transformer.") && p != "lm_loss.weight"));

    let classifier =
        custom("extend: bert-base-uncased\nhead: {task: sequence_classification, labels: 3}\nmodules: []\n")
            .expect("builds");
    assert_eq!(classifier.architecture, "BertForSequenceClassification");
    assert_eq!(classifier.facts.head, OutputHead::SequenceClassification { labels: 3 });
    let mut expected = fixture_parameters("BertForSequenceClassification");
    // The fixture has transformers' default of 2 labels.
    for (name, shape) in &mut expected {
        if name.starts_with("classifier.") {
            shape[0] = 3;
        }
    }
    assert_eq!(parameters(&classifier), expected);
}

#[test]
fn a_head_beside_added_modules_keeps_both() {
    let yaml = "extend: gpt2\nhead: {task: token_classification, labels: 9}\nmodules:\n  - name: transformer.extra\n    after: transformer.h.5\n    block: true\n    linear: {in: 768, out: 768}\n";
    let m = custom(yaml).expect("builds");
    assert_eq!(m.architecture, "GPT2ForTokenClassification");
    assert!(m.custom);
    assert!(m.has_path("classifier.weight") && m.has_path("transformer.extra.weight"));
    assert_eq!(m.facts.head, OutputHead::TokenClassification { labels: 9 });
}

#[test]
fn bad_heads_are_refused_with_the_key_and_the_fix() {
    let cases = [
        (
            "extend: xlnet-base-cased\nhead: summarization\nmodules: []\n",
            "unknown head task `summarization`",
            "sequence_classification",
        ),
        (
            "extend: gemma-2b\nhead: question_answering\nmodules: []\n",
            "has no `question_answering` head",
            "token_classification",
        ),
        (
            "extend: bert-base-uncased\nhead: {task: sequence_classification, labels: 0}\nmodules: []\n",
            "positive class count",
            "labels: 3",
        ),
        (
            "extend: bert-base-uncased\nhead: {task: none, labels: 4}\nmodules: []\n",
            "`labels` is for a classifier",
            "remove `labels`",
        ),
        (
            "extend: bert-base-uncased\nhead: {task: none, classes: 4}\nmodules: []\n",
            "unknown key `classes`",
            "`task` and `labels`",
        ),
        (
            "hidden_size: 64\nhead: none\nmodules:\n  - name: l\n    block: true\n    linear: {in: 64, out: 64}\n",
            "`head` replaces the head",
            "add `extend:`",
        ),
        ("extend: gpt2\nmodules: []\n", "`modules` is empty", "list the model's modules"),
    ];
    for (yaml, problem, fix) in cases {
        let err = custom(yaml).expect_err(yaml);
        let text = err.to_string();
        assert!(text.contains(problem), "{yaml}: {text}");
        assert!(text.contains(fix), "{yaml}: {text}");
        assert!(text.contains("model.yaml:"), "{yaml}: the error names the file and line: {text}");
    }
}

/// `num_labels` beside an `id2label` of another length: transformers 5.24's
/// `AutoConfig.from_pretrained` keeps `num_labels` (its setter rebuilds the map), 4.57 keeps the
/// map (both run on such a config: 3 and 7).
#[test]
fn num_labels_against_id2label_is_read_as_each_transformers_reads_it() {
    let text = include_str!("../catalog/models/llama-3.2-1b.json");
    let mut config: Value = serde_json::from_str(text).expect("JSON");
    config["architectures"] = serde_json::json!(["LlamaForSequenceClassification"]);
    config["num_labels"] = serde_json::json!(3);
    config["id2label"] = (0..7).map(|i| (i.to_string(), Value::String(format!("L{i}")))).collect();
    for (naming, labels) in [(model::Naming::V5, 3), (model::Naming::V4, 7)] {
        let model = model::hf::from_config_text(&config.to_string(), "conflict", ImportOptions { naming })
            .expect("builds");
        let score = model.root.tensor("score.weight").expect("the classifier");
        assert_eq!(score.shape, vec![labels, 2048], "{naming:?}");
        assert!(model.notes.iter().any(|n| n.contains("disagrees")), "{naming:?}: {:?}", model.notes);
    }
}
