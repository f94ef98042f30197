//! The boundary search every what-if query and remedy shares: the largest value in a range for
//! which a probe holds, found by galloping from a starting value (doubling up while it holds,
//! halving down while it does not) and then bisecting. Bisection is exact only where the probe is
//! monotone (it holds up to the boundary and fails past it), so every probe made is kept and
//! checked for that, with a few more probes (the range's low end, half the answer, twice the first
//! failure); where they disagree the range is scanned instead, at most [`SCAN_PROBES`] values.

use std::collections::BTreeMap;

/// The most values a scan probes where the probe is not monotone.
pub const SCAN_PROBES: u64 = 512;

/// What the search found; `T` is what each probe returns beside its verdict.
#[derive(Debug, Clone, PartialEq)]
pub struct Boundary<T> {
    /// The value just below the boundary, with its probe: for [`largest`] the largest that holds
    /// (`None` when the range's low end fails), for [`smallest`] the largest that fails (`None`
    /// when the low end holds).
    pub below: Option<(u64, T)>,
    /// The value just above it: for [`largest`] the smallest failure past `below` (`None` when
    /// the high end holds), for [`smallest`] the smallest value that holds (`None` when none
    /// does).
    pub above: Option<(u64, T)>,
    /// Every probe agreed with a single boundary. When false the range was scanned.
    pub monotone: bool,
    /// The scan's step where the probe was not monotone (1: every value), else 1.
    pub stride: u64,
    /// Probes made.
    pub probes: u32,
}

/// The largest value in `low..=high` for which `probe` holds, starting at `start`. `probe`
/// returns its verdict and what the answer should carry; an error stops the search.
pub fn largest<T, E>(
    low: u64,
    high: u64,
    start: u64,
    mut probe: impl FnMut(u64) -> Result<(bool, T), E>,
) -> Result<Boundary<T>, E> {
    let mut seen: BTreeMap<u64, (bool, T)> = BTreeMap::new();
    if low > high {
        return Ok(Boundary { below: None, above: None, monotone: true, stride: 1, probes: 0 });
    }
    let mut holds = |v: u64, seen: &mut BTreeMap<u64, (bool, T)>| -> Result<bool, E> {
        if let Some((ok, _)) = seen.get(&v) {
            return Ok(*ok);
        }
        let (ok, carried) = probe(v)?;
        seen.insert(v, (ok, carried));
        Ok(ok)
    };
    let start = start.clamp(low, high);
    let (mut good, mut bad) = (None, None);
    if holds(start, &mut seen)? {
        good = Some(start);
        let mut step = start.max(1);
        while let Some(g) = good
            && g < high
        {
            let next = g.saturating_add(step).min(high);
            if holds(next, &mut seen)? {
                good = Some(next);
                step = step.saturating_mul(2);
            } else {
                bad = Some(next);
                break;
            }
        }
    } else {
        bad = Some(start);
        while let Some(b) = bad
            && b > low
        {
            let next = (b / 2).clamp(low, b - 1);
            if holds(next, &mut seen)? {
                good = Some(next);
                break;
            }
            bad = Some(next);
        }
    }
    if let (Some(mut g), Some(mut b)) = (good, bad) {
        while b - g > 1 {
            let mid = g + (b - g) / 2;
            if holds(mid, &mut seen)? { g = mid } else { b = mid }
        }
        (good, bad) = (Some(g), Some(b));
    }
    // More evidence for the monotonicity check: the low end and half the answer hold, twice the
    // first failure fails.
    if let Some(g) = good {
        holds(low, &mut seen)?;
        holds((g / 2).max(low), &mut seen)?;
    }
    if let Some(b) = bad {
        holds(b.saturating_mul(2).min(high), &mut seen)?;
    }
    let monotone = is_monotone(&seen);
    let mut stride = 1;
    if !monotone {
        // Scan from the low end to the largest value probed; the answer is the largest value
        // that holds, the failure the next value scanned past it.
        let end = *seen.keys().next_back().unwrap_or(&high);
        stride = (end - low).div_ceil(SCAN_PROBES).max(1);
        let mut v = low;
        while v <= end {
            holds(v, &mut seen)?;
            v = match v.checked_add(stride) {
                Some(next) => next,
                None => break,
            };
        }
        good = seen.iter().filter(|(_, (ok, _))| *ok).map(|(&v, _)| v).next_back();
        bad = match good {
            Some(g) => seen.range(g + 1..).find(|(_, (ok, _))| !*ok).map(|(&v, _)| v),
            None => Some(low),
        };
    }
    let probes = seen.len() as u32;
    let below = good.and_then(|g| seen.remove(&g).map(|(_, t)| (g, t)));
    let above = bad.and_then(|b| seen.remove(&b).map(|(_, t)| (b, t)));
    Ok(Boundary { below, above, monotone, stride, probes })
}

/// The smallest value in `low..=high` for which `probe` holds, where it holds from some value
/// on: the boundary of the negation, one past its largest failure.
pub fn smallest<T, E>(
    low: u64,
    high: u64,
    start: u64,
    mut probe: impl FnMut(u64) -> Result<(bool, T), E>,
) -> Result<Boundary<T>, E> {
    largest(low, high, start, |v| probe(v).map(|(ok, t)| (!ok, t)))
}

/// Whether every value that holds lies below every value that fails.
fn is_monotone<T>(seen: &BTreeMap<u64, (bool, T)>) -> bool {
    let last_ok = seen.iter().filter(|(_, (ok, _))| *ok).map(|(&v, _)| v).next_back();
    let first_bad = seen.iter().find(|(_, (ok, _))| !*ok).map(|(&v, _)| v);
    match (last_ok, first_bad) {
        (Some(g), Some(b)) => g < b,
        _ => true,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn search(low: u64, high: u64, start: u64, ok: impl Fn(u64) -> bool) -> Boundary<()> {
        largest::<(), ()>(low, high, start, |v| Ok((ok(v), ()))).unwrap()
    }

    #[test]
    fn finds_every_threshold_from_every_start() {
        for threshold in 0..=40 {
            for start in 1..=40 {
                let b = search(1, 40, start, |v| v <= threshold);
                let expected = (threshold >= 1).then_some(threshold);
                assert_eq!(b.below.map(|(v, _)| v), expected, "threshold {threshold} start {start}");
                let next = (threshold < 40).then_some(threshold + 1);
                assert_eq!(b.above.map(|(v, _)| v), next, "threshold {threshold} start {start}");
                assert!(b.monotone);
            }
        }
    }

    #[test]
    fn a_hole_below_the_boundary_is_found_by_the_scan() {
        // Holds up to 30 except at 15 (what a non-monotone peak looks like).
        let b = search(1, 64, 8, |v| v <= 30 && v != 15);
        assert!(!b.monotone);
        assert_eq!(b.below.map(|(v, _)| v), Some(30));
        assert_eq!(b.above.map(|(v, _)| v), Some(31));
    }

    #[test]
    fn smallest_is_the_negation() {
        for threshold in 1..=20 {
            let b = smallest::<(), ()>(1, 20, 1, |v| Ok((v >= threshold, ()))).unwrap();
            assert_eq!(b.above.map(|(v, _)| v), Some(threshold));
            assert_eq!(b.below.map(|(v, _)| v), (threshold > 1).then_some(threshold - 1));
        }
    }

    #[test]
    fn probe_count_is_logarithmic() {
        let b = search(1, 1 << 20, 1, |v| v <= 336);
        assert_eq!(b.below.map(|(v, _)| v), Some(336));
        assert!(b.probes <= 24, "{} probes", b.probes);
    }
}
