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

/// What training updates each step: the parameters and AdamW's moments, flat in the model's
/// fixed order. Updated out of place (from one buffer into another), so a checkpoint can hold on
/// to the state of its step while training writes the next one elsewhere: no copy at the step
/// boundary.
#[derive(Debug, Clone, PartialEq)]
pub struct TrainTensors {
    /// The parameters.
    pub params: Vec<f32>,
    /// AdamW's first moments.
    pub m: Vec<f32>,
    /// AdamW's second moments.
    pub v: Vec<f32>,
}

impl TrainTensors {
    /// `params` with zero moments (the start of training).
    pub fn fresh(params: Vec<f32>) -> Self {
        let n = params.len();
        TrainTensors { params, m: vec![0.0; n], v: vec![0.0; n] }
    }
}

/// AdamW: its hyperparameters and step count; the moments live in [`TrainTensors`].
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct AdamW {
    /// Hyperparameters.
    pub config: AdamWConfig,
    /// Steps taken.
    pub t: u64,
}

impl AdamW {
    /// A fresh optimizer.
    pub fn new(config: AdamWConfig) -> Self {
        AdamW { config, t: 0 }
    }

    /// One update: `into` becomes `from` updated with `grads` (same length; `into`'s old contents
    /// are overwritten, its vectors resized when needed). Returns the gradients' L2 norm before
    /// clipping.
    pub fn step(&mut self, from: &TrainTensors, grads: &[f32], into: &mut TrainTensors) -> f64 {
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
        let n = from.params.len();
        for out in [&mut into.params, &mut into.m, &mut into.v] {
            out.resize(n, 0.0);
        }
        let inputs = from.params.iter().zip(&from.m).zip(&from.v).zip(grads);
        let outputs = into.params.iter_mut().zip(&mut into.m).zip(&mut into.v);
        for ((((&p, &m), &v), &g), ((p_out, m_out), v_out)) in inputs.zip(outputs) {
            let g = g * clip;
            let m = beta1 * m + (1.0 - beta1) * g;
            let v = beta2 * v + (1.0 - beta2) * g * g;
            *p_out = p * decay - step_size * m / (v.sqrt() + eps);
            *m_out = m;
            *v_out = v;
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
        let mut opt = AdamW::new(config);
        let mut out = TrainTensors::fresh(Vec::new());
        opt.step(&TrainTensors::fresh(vec![1.0f32, 1.0, 1.0]), &[0.5, -2.0, 0.0], &mut out);
        let params = out.params;
        assert_eq!(opt.t, 1);
        // Bias-corrected first step: m̂/√v̂ = sign(g).
        assert!((params[0] - 0.9).abs() < 1e-5, "{params:?}");
        assert!((params[1] - 1.1).abs() < 1e-5, "{params:?}");
        assert_eq!(params[2], 1.0);
    }

    #[test]
    fn weight_decay_and_clipping() {
        let config = AdamWConfig { grad_clip: 1.0, ..AdamWConfig::with_lr(0.1) };
        let mut opt = AdamW::new(config);
        let mut out = TrainTensors::fresh(Vec::new());
        let norm = opt.step(&TrainTensors::fresh(vec![2.0f32, 0.0]), &[0.0, 30.0], &mut out);
        let params = out.params;
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
        let run = |opt: &mut AdamW, mut state: TrainTensors, steps: std::ops::Range<usize>| {
            let mut spare = TrainTensors::fresh(Vec::new());
            for k in steps {
                opt.step(&state, &grads(k), &mut spare);
                std::mem::swap(&mut state, &mut spare);
            }
            state
        };
        let mut straight = AdamW::new(config);
        let straight_state = run(&mut straight, TrainTensors::fresh(vec![0.5f32; 100]), 0..10);
        let mut first = AdamW::new(config);
        let halfway = run(&mut first, TrainTensors::fresh(vec![0.5f32; 100]), 0..4);
        // What a checkpoint keeps: t and plain copies of the tensors.
        let mut second = AdamW { config, t: first.t };
        let resumed_state = run(&mut second, halfway.clone(), 4..10);
        assert_eq!(second, straight);
        let bits = |p: &[f32]| p.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
        assert_eq!(bits(&resumed_state.params), bits(&straight_state.params));
        assert_eq!(bits(&resumed_state.m), bits(&straight_state.m));
        assert_eq!(bits(&resumed_state.v), bits(&straight_state.v));
    }
}
