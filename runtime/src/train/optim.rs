//! AdamW on flat `f32` vectors: the state (m, v, t) is plain data, so a checkpoint stores it
//! exactly and a restored run continues bit for bit. Every element is updated with the same
//! scalar operations in the same order, so the result does not depend on threads.

use serde::{Deserialize, Serialize};

/// AdamW's hyperparameters (recorded in every checkpoint).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AdamWConfig {
    /// Learning rate.
    pub lr: f64,
    /// Decay of the first moment.
    pub beta1: f64,
    /// Decay of the second moment.
    pub beta2: f64,
    /// Added to the root of the second moment.
    pub eps: f64,
    /// Decoupled weight decay (per step: `p -= lr · weight_decay · p`).
    pub weight_decay: f64,
    /// Gradients are scaled down to this global L2 norm when longer (0 = no clipping).
    pub grad_clip: f64,
}

impl AdamWConfig {
    /// The defaults with learning rate `lr`.
    pub fn with_lr(lr: f64) -> Self {
        AdamWConfig { lr, beta1: 0.9, beta2: 0.99, eps: 1e-8, weight_decay: 0.01, grad_clip: 1.0 }
    }
}

/// AdamW's state.
#[derive(Debug, Clone, PartialEq)]
pub struct AdamW {
    /// Hyperparameters.
    pub config: AdamWConfig,
    /// Steps taken.
    pub t: u64,
    /// First moments, one per parameter.
    pub m: Vec<f32>,
    /// Second moments, one per parameter.
    pub v: Vec<f32>,
}

impl AdamW {
    /// Fresh state for `params` parameters.
    pub fn new(config: AdamWConfig, params: usize) -> Self {
        AdamW { config, t: 0, m: vec![0.0; params], v: vec![0.0; params] }
    }

    /// One update of `params` with `grads` (same length); returns the gradients' L2 norm before
    /// clipping.
    pub fn step(&mut self, params: &mut [f32], grads: &[f32]) -> f64 {
        let c = self.config;
        // Summed in f64 in index order: one fixed order, and no precision loss over ~10⁵ terms.
        let norm = grads.iter().map(|&g| f64::from(g) * f64::from(g)).sum::<f64>().sqrt();
        let clip = if c.grad_clip > 0.0 && norm > c.grad_clip { c.grad_clip / norm } else { 1.0 };
        self.t += 1;
        let t = i32::try_from(self.t).unwrap_or(i32::MAX);
        let bias1 = 1.0 - c.beta1.powi(t);
        let bias2 = 1.0 - c.beta2.powi(t);
        let step_size = (c.lr * bias2.sqrt() / bias1) as f32;
        let decay = (1.0 - c.lr * c.weight_decay) as f32;
        let (clip, beta1, beta2) = (clip as f32, c.beta1 as f32, c.beta2 as f32);
        let eps = (c.eps * bias2.sqrt()) as f32;
        for (((p, &g), m), v) in params.iter_mut().zip(grads).zip(&mut self.m).zip(&mut self.v) {
            let g = g * clip;
            *m = beta1 * *m + (1.0 - beta1) * g;
            *v = beta2 * *v + (1.0 - beta2) * g * g;
            *p = *p * decay - step_size * *m / (v.sqrt() + eps);
        }
        norm
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn first_step_moves_each_parameter_by_about_lr_against_its_gradient() {
        let config = AdamWConfig { weight_decay: 0.0, grad_clip: 0.0, ..AdamWConfig::with_lr(0.1) };
        let mut opt = AdamW::new(config, 3);
        let mut params = vec![1.0f32, 1.0, 1.0];
        opt.step(&mut params, &[0.5, -2.0, 0.0]);
        assert_eq!(opt.t, 1);
        // Bias-corrected first step: m̂/√v̂ = sign(g).
        assert!((params[0] - 0.9).abs() < 1e-5, "{params:?}");
        assert!((params[1] - 1.1).abs() < 1e-5, "{params:?}");
        assert_eq!(params[2], 1.0);
    }

    #[test]
    fn weight_decay_and_clipping() {
        let config = AdamWConfig { grad_clip: 1.0, ..AdamWConfig::with_lr(0.1) };
        let mut opt = AdamW::new(config, 2);
        let mut params = vec![2.0f32, 0.0];
        let norm = opt.step(&mut params, &[0.0, 30.0]);
        assert!((norm - 30.0).abs() < 1e-9);
        // Decay only on the first; the second moves by ~lr whatever the gradient's size.
        assert!((params[0] - 2.0 * (1.0 - 0.1 * 0.01)).abs() < 1e-6, "{params:?}");
        assert!((params[1] + 0.1).abs() < 1e-4, "{params:?}");
    }

    #[test]
    fn restored_state_continues_bit_for_bit() {
        let grads = |k: usize| -> Vec<f32> {
            (0..100).map(|i| ((i * 31 + k * 17) % 23) as f32 / 7.0 - 1.5).collect()
        };
        let config = AdamWConfig::with_lr(0.01);
        let mut straight = AdamW::new(config, 100);
        let mut params = vec![0.5f32; 100];
        for k in 0..10 {
            straight.step(&mut params, &grads(k));
        }
        let mut first = AdamW::new(config, 100);
        let mut resumed_params = vec![0.5f32; 100];
        for k in 0..4 {
            first.step(&mut resumed_params, &grads(k));
        }
        // What a checkpoint keeps: t, m, v, params (plain copies).
        let mut second = AdamW { config, t: first.t, m: first.m.clone(), v: first.v.clone() };
        for k in 4..10 {
            second.step(&mut resumed_params, &grads(k));
        }
        assert_eq!(second, straight);
        let bits = |p: &[f32]| p.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
        assert_eq!(bits(&resumed_params), bits(&params));
    }
}
