//! The statistics `fleetmend simulate --seeds` reports: a sample's mean with a two-sided
//! confidence interval from Student's t distribution, which holds for the few replications a
//! simulation can afford (the normal distribution's 1.96 understates the interval below ~30).
//!
//! The t quantile is computed rather than looked up: the distribution function through the
//! regularized incomplete beta function (a continued fraction, Numerical Recipes 6.4), inverted
//! by bisection, good to ~1e-10 for any number of degrees of freedom.

use serde::Serialize;

/// Bisection steps for a quantile: the bracket halves each step, from at most 2^70 wide.
const BISECTION_STEPS: u32 = 200;
/// Terms the incomplete beta function's continued fraction may take.
const CONTINUED_FRACTION_TERMS: u32 = 500;
/// Relative change at which the continued fraction has converged.
const CONVERGED: f64 = 1e-15;
/// Stands in for zero in the continued fraction's denominators (Lentz's method).
const TINY: f64 = 1e-300;

/// A confidence interval could not be computed.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum IntervalError {
    #[error("a confidence interval needs at least two samples, got {samples}")]
    TooFewSamples { samples: usize },
    #[error("confidence {confidence} is not between 0 and 1")]
    Confidence { confidence: f64 },
}

/// How an interval was computed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum IntervalMethod {
    /// mean ± t(1 − α/2, n − 1) · s / √n, s the sample's standard deviation.
    StudentT,
}

/// A sample's mean and the two-sided confidence interval around it.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct MeanInterval {
    pub mean: f64,
    /// Half the interval's width: it runs from `mean - half_width` to `mean + half_width`.
    pub half_width: f64,
    pub low: f64,
    pub high: f64,
    /// The share of such intervals that hold the true mean, e.g. 0.95.
    pub confidence: f64,
    pub method: IntervalMethod,
    /// The samples less one.
    pub degrees_of_freedom: u32,
}

impl MeanInterval {
    /// The mean of `samples` with its Student's t interval at `confidence` (e.g. 0.95).
    pub fn student_t(samples: &[f64], confidence: f64) -> Result<MeanInterval, IntervalError> {
        if !(confidence > 0.0 && confidence < 1.0) {
            return Err(IntervalError::Confidence { confidence });
        }
        if samples.len() < 2 {
            return Err(IntervalError::TooFewSamples { samples: samples.len() });
        }
        let n = samples.len() as f64;
        let mean = samples.iter().sum::<f64>() / n;
        let variance = samples.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / (n - 1.0);
        let degrees_of_freedom = u32::try_from(samples.len() - 1).unwrap_or(u32::MAX);
        let t = student_t_quantile(0.5 + confidence / 2.0, f64::from(degrees_of_freedom));
        let half_width = t * (variance / n).sqrt();
        Ok(MeanInterval {
            mean,
            half_width,
            low: mean - half_width,
            high: mean + half_width,
            confidence,
            method: IntervalMethod::StudentT,
            degrees_of_freedom,
        })
    }
}

/// P(T ≤ t) for Student's t distribution with `df` degrees of freedom (`df` > 0).
pub fn student_t_cdf(t: f64, df: f64) -> f64 {
    if t.is_nan() || df.is_nan() || df <= 0.0 {
        return f64::NAN;
    }
    // P(|T| > |t|) = I_{df/(df+t²)}(df/2, 1/2).
    let two_tailed = regularized_incomplete_beta(df / 2.0, 0.5, df / (df + t * t));
    if t > 0.0 { 1.0 - two_tailed / 2.0 } else { two_tailed / 2.0 }
}

/// The `p` quantile of Student's t distribution with `df` degrees of freedom: the t with
/// P(T ≤ t) = p (`p` in (0, 1), `df` > 0), e.g. 2.776 for p = 0.975 and df = 4.
pub fn student_t_quantile(p: f64, df: f64) -> f64 {
    if !(p > 0.0 && p < 1.0) || df.is_nan() || df <= 0.0 {
        return f64::NAN;
    }
    if p < 0.5 {
        return -student_t_quantile(1.0 - p, df);
    }
    let mut high = 1.0_f64;
    while student_t_cdf(high, df) < p && high < 1e21 {
        high *= 2.0;
    }
    let mut low = 0.0_f64;
    for _ in 0..BISECTION_STEPS {
        let middle = (low + high) / 2.0;
        if middle <= low || middle >= high {
            break;
        }
        if student_t_cdf(middle, df) < p {
            low = middle;
        } else {
            high = middle;
        }
    }
    (low + high) / 2.0
}

/// I_x(a, b), the regularized incomplete beta function, for a, b > 0 and x in [0, 1].
fn regularized_incomplete_beta(a: f64, b: f64, x: f64) -> f64 {
    if x <= 0.0 {
        return 0.0;
    }
    if x >= 1.0 {
        return 1.0;
    }
    let front =
        (ln_gamma(a + b) - ln_gamma(a) - ln_gamma(b) + a * x.ln() + b * (1.0 - x).ln()).exp();
    // The continued fraction converges fast below (a + 1) / (a + b + 2); above, use the symmetry
    // I_x(a, b) = 1 − I_{1−x}(b, a).
    if x < (a + 1.0) / (a + b + 2.0) {
        front * beta_continued_fraction(a, b, x) / a
    } else {
        1.0 - front * beta_continued_fraction(b, a, 1.0 - x) / b
    }
}

/// The incomplete beta function's continued fraction by the modified Lentz method.
fn beta_continued_fraction(a: f64, b: f64, x: f64) -> f64 {
    let away_from_zero = |value: f64| if value.abs() < TINY { TINY } else { value };
    let mut c = 1.0;
    let mut d = 1.0 / away_from_zero(1.0 - (a + b) * x / (a + 1.0));
    let mut fraction = d;
    for m in 1..=CONTINUED_FRACTION_TERMS {
        let m = f64::from(m);
        let even = m * (b - m) * x / ((a + 2.0 * m - 1.0) * (a + 2.0 * m));
        d = 1.0 / away_from_zero(1.0 + even * d);
        c = away_from_zero(1.0 + even / c);
        fraction *= d * c;
        let odd = -(a + m) * (a + b + m) * x / ((a + 2.0 * m) * (a + 2.0 * m + 1.0));
        d = 1.0 / away_from_zero(1.0 + odd * d);
        c = away_from_zero(1.0 + odd / c);
        let step = d * c;
        fraction *= step;
        if (step - 1.0).abs() < CONVERGED {
            break;
        }
    }
    fraction
}

/// ln Γ(x) for x ≥ 0.5 (all the t distribution needs), by Lanczos' approximation (g = 7, nine
/// coefficients): ~15 significant digits.
fn ln_gamma(x: f64) -> f64 {
    const G: f64 = 7.0;
    const COEFFICIENTS: [f64; 9] = [
        0.999_999_999_999_809_9,
        676.520_368_121_885_1,
        -1_259.139_216_722_402_8,
        771.323_428_777_653_1,
        -176.615_029_162_140_6,
        12.507_343_278_686_905,
        -0.138_571_095_265_720_12,
        9.984_369_578_019_572e-6,
        1.505_632_735_149_311_6e-7,
    ];
    let x = x - 1.0;
    let series = COEFFICIENTS[1..]
        .iter()
        .enumerate()
        .fold(COEFFICIENTS[0], |sum, (i, c)| sum + c / (x + i as f64 + 1.0));
    let t = x + G + 0.5;
    0.5 * (2.0 * std::f64::consts::PI).ln() + (x + 0.5) * t.ln() - t + series.ln()
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use super::*;

    fn close(actual: f64, expected: f64, tolerance: f64) -> bool {
        (actual - expected).abs() <= tolerance
    }

    #[test]
    fn t_quantiles_match_the_published_table() {
        // Two-sided 95 % (p = 0.975) and one-sided 95 % (p = 0.95), from any t table.
        for (p, df, expected) in [
            (0.975, 1.0, 12.706_205),
            (0.975, 2.0, 4.302_653),
            (0.975, 3.0, 3.182_446),
            (0.975, 4.0, 2.776_445),
            (0.975, 9.0, 2.262_157),
            (0.975, 29.0, 2.045_230),
            (0.975, 1000.0, 1.962_339),
            (0.95, 10.0, 1.812_461),
            (0.995, 5.0, 4.032_143),
        ] {
            let t = student_t_quantile(p, df);
            assert!(close(t, expected, 1e-5), "t({p}, {df}) = {t}, not {expected}");
        }
    }

    #[test]
    fn t_tends_to_the_normal_quantile() {
        assert!(close(student_t_quantile(0.975, 1e9), 1.959_964, 1e-5));
    }

    #[test]
    fn the_distribution_is_symmetric_and_the_quantile_its_inverse() {
        assert_eq!(student_t_cdf(0.0, 3.0), 0.5);
        for df in [1.0, 2.5, 7.0, 40.0] {
            for t in [0.1, 1.0, 2.0, 8.0] {
                let sum = student_t_cdf(t, df) + student_t_cdf(-t, df);
                assert!(close(sum, 1.0, 1e-12), "df {df}, t {t}: {sum}");
            }
            for p in [0.6, 0.9, 0.975, 0.999] {
                let t = student_t_quantile(p, df);
                assert!(close(student_t_cdf(t, df), p, 1e-10), "df {df}, p {p}");
                assert!(close(student_t_quantile(1.0 - p, df), -t, 1e-9), "df {df}, p {p}");
            }
        }
        // df = 1 is the Cauchy distribution: P(T ≤ 1) = 3/4.
        assert!(close(student_t_cdf(1.0, 1.0), 0.75, 1e-12));
    }

    #[test]
    fn quantiles_outside_the_distribution_are_nan() {
        for (p, df) in [(0.0, 4.0), (1.0, 4.0), (f64::NAN, 4.0), (0.975, 0.0), (0.975, -1.0)] {
            assert!(student_t_quantile(p, df).is_nan(), "p {p}, df {df}");
        }
    }

    #[test]
    fn ln_gamma_of_known_values() {
        assert!(close(ln_gamma(1.0), 0.0, 1e-14));
        assert!(close(ln_gamma(0.5), std::f64::consts::PI.sqrt().ln(), 1e-14));
        assert!(close(ln_gamma(10.0), 362_880_f64.ln(), 1e-12));
    }

    #[test]
    fn the_interval_of_five_samples() {
        let interval = MeanInterval::student_t(&[0.90, 0.92, 0.91, 0.95, 0.87], 0.95).unwrap();
        assert!(close(interval.mean, 0.91, 1e-12));
        // s = sqrt(0.0034 / 4) = 0.029155; 2.776445 * s / sqrt(5) = 0.036200.
        assert!(close(interval.half_width, 0.036_200, 1e-6), "{interval:?}");
        assert!(close(interval.low, 0.91 - interval.half_width, 1e-15));
        assert!(close(interval.high, 0.91 + interval.half_width, 1e-15));
        assert_eq!(interval.degrees_of_freedom, 4);
        assert_eq!(interval.method, IntervalMethod::StudentT);
        assert_eq!(interval.confidence, 0.95);
    }

    #[test]
    fn equal_samples_have_no_width() {
        let interval = MeanInterval::student_t(&[0.5, 0.5, 0.5], 0.95).unwrap();
        assert_eq!((interval.mean, interval.half_width), (0.5, 0.0));
    }

    #[test]
    fn an_interval_needs_two_samples_and_a_confidence_below_one() {
        assert_eq!(
            MeanInterval::student_t(&[0.9], 0.95).unwrap_err(),
            IntervalError::TooFewSamples { samples: 1 }
        );
        assert!(MeanInterval::student_t(&[], 0.95).is_err());
        for confidence in [0.0, 1.0, 95.0, f64::NAN] {
            let err = MeanInterval::student_t(&[0.9, 0.8], confidence).unwrap_err();
            assert!(err.to_string().contains("is not between 0 and 1"), "{err}");
        }
    }

    #[test]
    fn the_method_is_named_in_json() {
        assert_eq!(serde_json::to_string(&IntervalMethod::StudentT).unwrap(), "\"student-t\"");
    }
}
