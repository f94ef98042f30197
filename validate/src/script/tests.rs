//! The script validator's reading of harness results, without Python: results that do not match
//! the profile, the allocator replay, the answer over ranks.

use super::super::{ScriptOutcome, combine};
use super::*;
use std::collections::BTreeMap;
use vramplan_profiles::hardware::HardwareProfile;

fn t4x2() -> HardwareProfile {
    vramplan_profiles::hardware::load("t4x2").unwrap()
}

/// A harness result with `outcome`, over the profile's `gpus`, and `mismatch` devices.
fn result(outcome: &str, gpus: u32, devices: &[&str], events: Vec<(u32, u64, u64)>) -> HarnessResult {
    HarnessResult {
        outcome: outcome.to_string(),
        message: String::new(),
        location: None,
        module: String::new(),
        mismatch: (outcome == "device_mismatch").then(|| HarnessMismatch {
            operation: "mul".into(),
            devices: devices.iter().map(|d| d.to_string()).collect(),
            shapes: vec![],
            module: String::new(),
            location: Some(Location { file: "train.py".into(), line: 3, function: "<module>".into() }),
            phase: "forward".into(),
            message: String::new(),
        }),
        oom: None,
        steps: 2,
        forwards: 2,
        optimizers: 1,
        cuda_ops: 10,
        cpu_ops: 0,
        per_device: (0..gpus)
            .map(|device| HarnessDevice {
                device,
                peak_allocated_bytes: 1024,
                peak_reserved_bytes: None,
                peak_at: None,
                peak_module: String::new(),
                usable_bytes: 1 << 30,
            })
            .collect(),
        peak_total_bytes: 2048,
        peak_total_workspace_bytes: 0,
        events,
        phases: vec![(0, "load".into(), 0)],
        activations: None,
        notes: vec![],
        versions: BTreeMap::new(),
        seconds: 1.0,
    }
}

#[test]
fn a_result_that_does_not_match_the_profile_is_refused() {
    let hw = t4x2();
    assert!(
        rank_run(result("completed", 3, &[], vec![]), 0, &hw, None).is_err(),
        "three devices for two GPUs"
    );
    let bad = result("device_mismatch", 2, &["cuda:5", "cpu"], vec![]);
    assert!(rank_run(bad, 0, &hw, None).unwrap_err().contains("cuda:5"));
    assert!(
        rank_run(result("completed", 2, &[], vec![(7, 1, 512)]), 0, &hw, None).is_err(),
        "an event on GPU 7"
    );
    assert!(
        rank_run(result("passed", 2, &[], vec![]), 0, &hw, None).is_err(),
        "an outcome the harness never writes"
    );
    let fine = rank_run(result("device_mismatch", 2, &["cuda:1", "cpu"], vec![]), 0, &hw, None).unwrap().0;
    assert_eq!(fine.outcome, ScriptOutcome::DeviceMismatch);
    assert_eq!(fine.location.unwrap().line, 3);
}

#[test]
fn reserved_bytes_come_from_the_allocator_model() {
    let hw = t4x2();
    // 2 MiB and 3 MiB on GPU 0: requests over 1 MiB (PyTorch's kSmallSize) and under 10 MiB
    // (kMinLargeAlloc) are carved from 20 MiB segments (kLargeBuffer), so one segment holds
    // both.
    let events = vec![(0, 1, 2 << 20), (0, 2, 3 << 20), (0, 1, 0)];
    let run = rank_run(result("completed", 2, &[], events), 0, &hw, None).unwrap().0;
    assert_eq!(run.per_device[0].peak_reserved_bytes, 20 << 20);
    let context = hw.devices[0].context_reserve_bytes;
    assert_eq!(run.per_device[0].device_used_bytes, (20 << 20) + context);
    assert_eq!(run.per_device[1].peak_reserved_bytes, 1024, "no allocation: the allocated peak stands");
}

#[test]
fn the_most_severe_rank_answers_and_ranks_add_up_per_gpu() {
    let hw = t4x2();
    let ok = rank_run(result("completed", 2, &[], vec![]), 0, &hw, None).unwrap().0;
    let bad = rank_run(result("device_mismatch", 2, &["cuda:1", "cuda:0"], vec![]), 1, &hw, None).unwrap().0;
    let all = combine(vec![ok, bad], &hw, BTreeMap::new());
    assert_eq!(all.outcome, ScriptOutcome::DeviceMismatch);
    assert_eq!(all.rank, 1);
    assert_eq!(all.devices, vec!["cuda:1", "cuda:0"]);
    assert_eq!(all.per_device[0].peak_allocated_bytes, 2048, "both ranks' bytes on GPU 0");
}
