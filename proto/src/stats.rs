//! Medians and quantiles of samples, one definition each for every crate: the repairer's job
//! health and all-reduce baselines, the probe's timing, the scenario summaries and the benches.
//! Here rather than in each crate because every crate of the workspace already links this one.
//!
//! Two definitions, on purpose:
//! - [`median`] interpolates: with an even count it is the mean of the middle two values, so a
//!   step time or a bandwidth baseline sits between its neighbours and does not lean either way.
//! - [`nearest_rank`] never interpolates: the `q` quantile is one of the values themselves (the
//!   smallest with at least a `q` share of the values at or below it), which is how latency
//!   targets are stated ("p99 under 250 ms": 99 % of the answers took at most that).
//!
//! For `q` = 0.5 and an even count the two differ: nearest rank takes the lower middle value.

/// The finite `values`, ascending: NaN and the infinities are left out, since a value that is not
/// a number (or not a measurement, like a bandwidth over zero seconds) would sort to an end and
/// pull a quantile with it.
pub fn sorted_finite(values: impl IntoIterator<Item = f64>) -> Vec<f64> {
    let mut sorted: Vec<f64> = values.into_iter().filter(|v| v.is_finite()).collect();
    sorted.sort_by(f64::total_cmp);
    sorted
}

/// The median of the finite `values` (the mean of the middle two for an even count); `None`
/// when there is no finite value.
pub fn median(values: impl IntoIterator<Item = f64>) -> Option<f64> {
    let sorted = sorted_finite(values);
    let mid = sorted.len() / 2;
    match sorted.len() {
        0 => None,
        n if n.is_multiple_of(2) => Some((sorted[mid - 1] + sorted[mid]) / 2.0),
        _ => Some(sorted[mid]),
    }
}

/// The nearest-rank `q` quantile of `sorted` (ascending), `q` in [0, 1] (0.99 for p99): the value
/// at rank ⌈q·n⌉, counting from 1, held to the first and the last. `None` when `sorted` is empty.
pub fn nearest_rank<T: Copy>(sorted: &[T], q: f64) -> Option<T> {
    if sorted.is_empty() {
        return None;
    }
    let rank = ((q * sorted.len() as f64).ceil() as usize).clamp(1, sorted.len());
    Some(sorted[rank - 1])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_median_interpolates_between_the_middle_two() {
        assert_eq!(median([3.0, 1.0, 2.0]), Some(2.0));
        assert_eq!(median([4.0, 1.0, 3.0, 2.0]), Some(2.5));
        assert_eq!(median([7.5]), Some(7.5));
        assert_eq!(median(std::iter::empty()), None);
    }

    #[test]
    fn the_median_leaves_out_what_is_not_finite() {
        assert_eq!(median([f64::NAN, 1.0, f64::INFINITY, 3.0, f64::NEG_INFINITY]), Some(2.0));
        assert_eq!(median([f64::NAN, f64::INFINITY]), None);
        assert_eq!(sorted_finite([2.0, f64::NAN, -1.0, f64::INFINITY, 0.0]), [-1.0, 0.0, 2.0]);
    }

    #[test]
    fn nearest_rank_takes_a_value_of_the_sample() {
        let hundred: Vec<f64> = (1..=100).map(f64::from).collect();
        assert_eq!(nearest_rank(&hundred, 0.5), Some(50.0));
        assert_eq!(nearest_rank(&hundred, 0.99), Some(99.0));
        assert_eq!(nearest_rank(&hundred, 0.999), Some(100.0));
        // Three values: the median is the second, p99 the third.
        assert_eq!(nearest_rank(&[0.1, 0.2, 0.3], 0.5), Some(0.2));
        assert_eq!(nearest_rank(&[0.1, 0.2, 0.3], 0.99), Some(0.3));
        // An even count: the lower middle value, where the median would interpolate.
        assert_eq!(nearest_rank(&[10_u32, 20, 30, 40], 0.5), Some(20));
        assert_eq!(median([10.0, 20.0, 30.0, 40.0]), Some(25.0));
    }

    #[test]
    fn nearest_rank_holds_to_the_ends_and_is_none_when_empty() {
        let sorted = [5_u32, 6, 7];
        assert_eq!(nearest_rank(&sorted, 0.0), Some(5));
        assert_eq!(nearest_rank(&sorted, -1.0), Some(5));
        assert_eq!(nearest_rank(&sorted, 1.0), Some(7));
        assert_eq!(nearest_rank(&sorted, 2.0), Some(7));
        assert_eq!(nearest_rank(&[42_u32], 0.99), Some(42));
        assert_eq!(nearest_rank::<u32>(&[], 0.5), None);
    }
}
