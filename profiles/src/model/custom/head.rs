//! `head:` in a custom model that `extend`s a config: the extended model built as its family's
//! base model (`head: none`) or as one of its task-head classes (`head: {task:
//! sequence_classification, labels: 3}`), exactly as the config importer builds that class
//! (`hf/heads.rs`: transformers' names, no tied output embedding); `labels` becomes the
//! config's `num_labels` (and its `id2label`, which transformers lets win, is dropped).

use super::assemble::at;
use crate::InputError;
use crate::model::hf::{self, HEAD_TASKS, HfConfig};
use crate::model::{ImportOptions, ModelDescription};
use serde_json::Value;
use serde_saphyr::Spanned;

/// The task and class count `head` asks for.
struct Wanted<'a> {
    task: &'a str,
    labels: Option<u64>,
}

fn task_names() -> String {
    HEAD_TASKS.iter().map(|(name, _)| format!("`{name}`")).collect::<Vec<_>>().join(", ")
}

/// Reads `head:`: a task name, or a map with `task` and optionally `labels`.
fn read<'a>(origin: &str, head: &'a Spanned<Value>) -> Result<Wanted<'a>, InputError> {
    let fix = || {
        format!(
            "write `head: none`, or `head: {{task: sequence_classification, labels: 3}}` with a task among {}",
            task_names()
        )
    };
    let (task, labels) = match &head.value {
        Value::String(task) => (task.as_str(), None),
        Value::Object(map) => {
            if let Some(key) = map.keys().find(|k| *k != "task" && *k != "labels") {
                return Err(at(origin, &head.referenced, format!("`head` has an unknown key `{key}`"))
                    .with_fix("a head takes `task` and `labels`"));
            }
            let Some(Value::String(task)) = map.get("task") else {
                return Err(at(origin, &head.referenced, "`head` needs a `task` name").with_fix(fix()));
            };
            let labels = match map.get("labels") {
                None => None,
                Some(Value::Number(n)) if n.as_u64().is_some_and(|n| n > 0) => n.as_u64(),
                Some(other) => {
                    return Err(at(
                        origin,
                        &head.referenced,
                        format!("`head.labels` must be a positive class count, not {other}"),
                    )
                    .with_fix("give the number of classes, e.g. `labels: 3`"));
                }
            };
            (task.as_str(), labels)
        }
        other => {
            return Err(
                at(origin, &head.referenced, format!("`head` is {other}, not a task")).with_fix(fix())
            );
        }
    };
    if !HEAD_TASKS.iter().any(|(name, _)| *name == task) {
        return Err(at(origin, &head.referenced, format!("unknown head task `{task}`")).with_fix(fix()));
    }
    if labels.is_some() && !task.ends_with("classification") {
        return Err(at(origin, &head.referenced, format!("`labels` is for a classifier, not `{task}`"))
            .with_fix("remove `labels`, or choose sequence_classification or token_classification"));
    }
    Ok(Wanted { task, labels })
}

/// `config` (the extended model's, as text, from `name`) built with `head`'s class.
pub(super) fn build(
    origin: &str,
    head: &Spanned<Value>,
    config_text: &str,
    name: &str,
    options: ImportOptions,
) -> Result<ModelDescription, InputError> {
    let wanted = read(origin, head)?;
    let config = HfConfig::parse(config_text, name)?;
    let arch = config.architecture()?;
    let class = hf::head_class_for(&arch, wanted.task).map_err(|offered| {
        let problem = format!("`{arch}` has no `{}` head in transformers", wanted.task);
        let fix = if offered.is_empty() {
            "vramplan builds task heads for the families of docs/models.md; describe the head among `modules`"
                .to_string()
        } else {
            format!(
                "its family has: {}",
                offered.iter().map(|t| format!("`{t}`")).collect::<Vec<_>>().join(", ")
            )
        };
        at(origin, &head.referenced, problem).with_fix(fix)
    })?;
    let mut object = config.object().clone();
    object.insert("architectures".into(), Value::from(vec![class]));
    if let Some(labels) = wanted.labels {
        object.insert("num_labels".into(), Value::from(labels));
        object.remove("id2label");
        object.remove("label2id");
    }
    hf::from_config(&HfConfig::from_object(object, name), options)
}
