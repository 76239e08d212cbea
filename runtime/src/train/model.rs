//! The model: a small GPT-style byte-level language model (vocabulary 256) on candle.
//!
//! Token and position embeddings, `layers` pre-LayerNorm blocks (causal multi-head
//! self-attention, then a GELU MLP, each with a residual), a final LayerNorm and a linear head.
//!
//! Every parameter is a candle [`Var`] held in one fixed order ([`ParamSpec`] list): gradients
//! are gathered into one flat vector in that order, the optimizer updates a flat master copy,
//! checkpoints store the parameters by name, and the weights hash is taken over that order. The
//! layers are written with basic, differentiable candle ops (candle-nn's fused LayerNorm and
//! last-dimension softmax have no backward pass).

use candle_core::{D, DType, Device, Tensor, Var};
use serde::{Deserialize, Serialize};

/// The byte-level vocabulary.
pub const VOCAB: usize = 256;

const LAYER_NORM_EPS: f64 = 1e-5;
/// Standard deviation of the initial weights (GPT-2's).
const INIT_STD: f64 = 0.02;

/// The model's shape: what must match for a checkpoint to be resumed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ModelConfig {
    /// Vocabulary size (bytes: 256).
    pub vocab: usize,
    /// Width of the residual stream.
    pub model_dim: usize,
    /// Number of transformer blocks.
    pub layers: usize,
    /// Attention heads per block (`model_dim` must be a multiple).
    pub heads: usize,
    /// Longest sequence (the position embedding's length).
    pub context: usize,
}

impl ModelConfig {
    /// Every problem with these values, each naming its flag; empty when usable.
    pub fn problems(&self) -> Vec<String> {
        let mut problems = Vec::new();
        if self.model_dim == 0 {
            problems.push("--model-dim: must be at least 1".to_string());
        }
        if self.layers == 0 {
            problems.push("--layers: must be at least 1".to_string());
        }
        if self.heads == 0 {
            problems.push("--heads: must be at least 1".to_string());
        } else if !self.model_dim.is_multiple_of(self.heads) {
            problems.push(format!(
                "--heads: {} does not divide --model-dim {}",
                self.heads, self.model_dim
            ));
        }
        if self.context < 2 {
            problems.push("--context: must be at least 2".to_string());
        }
        problems
    }

    /// The parameters in their fixed order.
    pub fn param_specs(&self) -> Vec<ParamSpec> {
        let c = self.model_dim;
        // Residual projections start smaller so the residual stream's variance does not grow
        // with depth (GPT-2).
        let proj_std = INIT_STD / ((2 * self.layers) as f64).sqrt();
        let mut specs = vec![
            ParamSpec::new("wte", &[self.vocab, c], Init::Normal(INIT_STD)),
            ParamSpec::new("wpe", &[self.context, c], Init::Normal(INIT_STD)),
        ];
        for layer in 0..self.layers {
            let p = |name: &str| format!("h{layer}.{name}");
            specs.extend([
                ParamSpec::new(&p("ln1.weight"), &[c], Init::Ones),
                ParamSpec::new(&p("ln1.bias"), &[c], Init::Zeros),
                ParamSpec::new(&p("attn.qkv.weight"), &[3 * c, c], Init::Normal(INIT_STD)),
                ParamSpec::new(&p("attn.qkv.bias"), &[3 * c], Init::Zeros),
                ParamSpec::new(&p("attn.proj.weight"), &[c, c], Init::Normal(proj_std)),
                ParamSpec::new(&p("attn.proj.bias"), &[c], Init::Zeros),
                ParamSpec::new(&p("ln2.weight"), &[c], Init::Ones),
                ParamSpec::new(&p("ln2.bias"), &[c], Init::Zeros),
                ParamSpec::new(&p("mlp.fc.weight"), &[4 * c, c], Init::Normal(INIT_STD)),
                ParamSpec::new(&p("mlp.fc.bias"), &[4 * c], Init::Zeros),
                ParamSpec::new(&p("mlp.proj.weight"), &[c, 4 * c], Init::Normal(proj_std)),
                ParamSpec::new(&p("mlp.proj.bias"), &[c], Init::Zeros),
            ]);
        }
        specs.extend([
            ParamSpec::new("lnf.weight", &[c], Init::Ones),
            ParamSpec::new("lnf.bias", &[c], Init::Zeros),
            ParamSpec::new("head.weight", &[self.vocab, c], Init::Normal(INIT_STD)),
        ]);
        specs
    }

    /// Total number of parameters.
    pub fn param_count(&self) -> usize {
        self.param_specs().iter().map(ParamSpec::len).sum()
    }
}

/// How a parameter starts.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Init {
    /// All zeros (biases).
    Zeros,
    /// All ones (LayerNorm gains).
    Ones,
    /// Normal with mean 0 and this standard deviation.
    Normal(f64),
}

/// One parameter: its checkpoint name, shape and initialisation.
#[derive(Debug, Clone, PartialEq)]
pub struct ParamSpec {
    /// Name in the checkpoint's safetensors files.
    pub name: String,
    /// Shape.
    pub shape: Vec<usize>,
    /// Initialisation.
    pub init: Init,
}

impl ParamSpec {
    fn new(name: &str, shape: &[usize], init: Init) -> Self {
        ParamSpec { name: name.to_string(), shape: shape.to_vec(), init }
    }

    /// Number of elements.
    pub fn len(&self) -> usize {
        self.shape.iter().product()
    }

    /// Whether it has no elements.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// The initial parameters, flat in the fixed order: a pure function of the configuration and
/// the seed (candle's own CPU random numbers cannot be seeded).
pub fn initial_params(config: &ModelConfig, seed: u64) -> Vec<f32> {
    let mut flat = Vec::with_capacity(config.param_count());
    for (index, spec) in config.param_specs().iter().enumerate() {
        match spec.init {
            Init::Zeros => flat.extend(std::iter::repeat_n(0.0f32, spec.len())),
            Init::Ones => flat.extend(std::iter::repeat_n(1.0f32, spec.len())),
            Init::Normal(std) => {
                let mut rng = SplitMix64::new(seed ^ 0x5EED_0000_0000_0000 ^ index as u64);
                flat.extend((0..spec.len()).map(|_| (rng.normal() * std) as f32));
            }
        }
    }
    flat
}

/// SplitMix64: tiny, fast, and fixed here forever (a library RNG may change its stream between
/// versions, which would change every seeded run).
#[derive(Debug, Clone)]
pub struct SplitMix64 {
    state: u64,
}

impl SplitMix64 {
    /// A generator starting from `seed`.
    pub fn new(seed: u64) -> Self {
        SplitMix64 { state: seed }
    }

    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.state = self.state.wrapping_add(0x9E37_79B9_7F4A_7C15);
        mix64(self.state)
    }

    /// Uniform in [0, 1).
    pub fn uniform(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 * (1.0 / (1u64 << 53) as f64)
    }

    /// Standard normal (Box-Muller).
    pub fn normal(&mut self) -> f64 {
        let u1 = 1.0 - self.uniform(); // (0, 1]: ln is finite
        let u2 = self.uniform();
        (-2.0 * u1.ln()).sqrt() * (std::f64::consts::TAU * u2).cos()
    }
}

/// SplitMix64's output function: a good 64-bit mixer, also used to hash (seed, step, rank, …).
pub fn mix64(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// The model's parameters as candle variables, in the fixed order.
#[derive(Debug)]
pub struct Gpt {
    config: ModelConfig,
    specs: Vec<ParamSpec>,
    vars: Vec<Var>,
    /// Additive causal mask (context × context): 0 on and below the diagonal, very negative
    /// above it.
    mask: Tensor,
    device: Device,
}

impl Gpt {
    /// The model with the parameters `flat` (fixed order) on `device`.
    pub fn new(config: ModelConfig, flat: &[f32], device: &Device) -> candle_core::Result<Self> {
        let specs = config.param_specs();
        let mut vars = Vec::with_capacity(specs.len());
        let mut offset = 0;
        for spec in &specs {
            let values = flat.get(offset..offset + spec.len()).ok_or_else(|| {
                candle_core::Error::Msg(format!(
                    "{} parameters given, the model has {}",
                    flat.len(),
                    config.param_count()
                ))
            })?;
            let tensor = Tensor::from_slice(values, spec.shape.as_slice(), device)?;
            vars.push(Var::from_tensor(&tensor)?);
            offset += spec.len();
        }
        let t = config.context;
        let mask: Vec<f32> = (0..t * t).map(|i| if i % t > i / t { -1e9 } else { 0.0 }).collect();
        let mask = Tensor::from_vec(mask, (t, t), device)?;
        Ok(Gpt { config, specs, vars, mask, device: device.clone() })
    }

    /// The configuration.
    pub fn config(&self) -> &ModelConfig {
        &self.config
    }

    /// Replaces every parameter with `flat` (fixed order).
    pub fn set_params(&self, flat: &[f32]) -> candle_core::Result<()> {
        let mut offset = 0;
        for (spec, var) in self.specs.iter().zip(&self.vars) {
            let values = flat
                .get(offset..offset + spec.len())
                .ok_or_else(|| candle_core::Error::Msg("parameter vector too short".into()))?;
            var.set(&Tensor::from_slice(values, spec.shape.as_slice(), &self.device)?)?;
            offset += spec.len();
        }
        Ok(())
    }

    /// Mean cross-entropy of predicting `targets` from `inputs` (both batch × time, byte ids),
    /// and the gradient of every parameter, flat in the fixed order, appended to `grads_out`.
    pub fn loss_and_grads(
        &self,
        inputs: &[u32],
        targets: &[u32],
        batch: usize,
        grads_out: &mut Vec<f32>,
    ) -> candle_core::Result<f32> {
        let time = inputs.len() / batch.max(1);
        let ids = Tensor::from_slice(inputs, (batch, time), &self.device)?;
        let targets = Tensor::from_slice(targets, batch * time, &self.device)?;
        let logits = self.forward(&ids)?;
        let loss =
            candle_nn::loss::cross_entropy(&logits.reshape((batch * time, VOCAB))?, &targets)?;
        let grads = loss.backward()?;
        for (spec, var) in self.specs.iter().zip(&self.vars) {
            match grads.get(var.as_tensor()) {
                Some(grad) => grads_out.extend(grad.flatten_all()?.to_vec1::<f32>()?),
                // A parameter the loss does not depend on (none in this model) gets no update
                // from its gradient.
                None => grads_out.extend(std::iter::repeat_n(0.0f32, spec.len())),
            }
        }
        loss.to_dtype(DType::F32)?.to_scalar::<f32>()
    }

    /// Logits (batch × time × vocab) for `ids` (batch × time, time ≤ context).
    pub fn forward(&self, ids: &Tensor) -> candle_core::Result<Tensor> {
        let (batch, time) = ids.dims2()?;
        let c = self.config.model_dim;
        let v = |i: usize| self.vars[i].as_tensor();
        let tok = v(0).index_select(&ids.flatten_all()?, 0)?.reshape((batch, time, c))?;
        let pos = v(1).narrow(0, 0, time)?;
        let mut x = tok.broadcast_add(&pos)?;
        let mask = self.mask.narrow(0, 0, time)?.narrow(1, 0, time)?;
        for layer in 0..self.config.layers {
            let base = 2 + layer * 12;
            let h = layer_norm(&x, v(base), v(base + 1))?;
            let h =
                self.attention(&h, v(base + 2), v(base + 3), v(base + 4), v(base + 5), &mask)?;
            x = (x + h)?;
            let h = layer_norm(&x, v(base + 6), v(base + 7))?;
            let h =
                linear(&linear(&h, v(base + 8), v(base + 9))?.gelu()?, v(base + 10), v(base + 11))?;
            x = (x + h)?;
        }
        let base = 2 + self.config.layers * 12;
        let x = layer_norm(&x, v(base), v(base + 1))?;
        let (b, t, c) = x.dims3()?;
        x.reshape((b * t, c))?.matmul(&v(base + 2).t()?)?.reshape((b, t, VOCAB))
    }

    #[allow(clippy::too_many_arguments)]
    fn attention(
        &self,
        x: &Tensor,
        qkv_w: &Tensor,
        qkv_b: &Tensor,
        proj_w: &Tensor,
        proj_b: &Tensor,
        mask: &Tensor,
    ) -> candle_core::Result<Tensor> {
        let (b, t, c) = x.dims3()?;
        let heads = self.config.heads;
        let head_dim = c / heads;
        let qkv = linear(x, qkv_w, qkv_b)?;
        let split = |i: usize| -> candle_core::Result<Tensor> {
            qkv.narrow(2, i * c, c)?.reshape((b, t, heads, head_dim))?.transpose(1, 2)?.contiguous()
        };
        let (q, k, v) = (split(0)?, split(1)?, split(2)?);
        let scale = 1.0 / (head_dim as f64).sqrt();
        let scores = (q.matmul(&k.t()?)? * scale)?.broadcast_add(mask)?;
        let weights = candle_nn::ops::softmax(&scores, D::Minus1)?;
        let y = weights.matmul(&v)?.transpose(1, 2)?.contiguous()?.reshape((b, t, c))?;
        linear(&y, proj_w, proj_b)
    }
}

/// `x · wᵀ + b` over the last dimension of a batch × time × in tensor.
fn linear(x: &Tensor, w: &Tensor, b: &Tensor) -> candle_core::Result<Tensor> {
    let (batch, time, inputs) = x.dims3()?;
    let outputs = w.dim(0)?;
    x.reshape((batch * time, inputs))?
        .matmul(&w.t()?)?
        .broadcast_add(b)?
        .reshape((batch, time, outputs))
}

/// LayerNorm over the last dimension, from basic ops (so it has a backward pass).
fn layer_norm(x: &Tensor, weight: &Tensor, bias: &Tensor) -> candle_core::Result<Tensor> {
    let mean = x.mean_keepdim(D::Minus1)?;
    let centered = x.broadcast_sub(&mean)?;
    let variance = centered.sqr()?.mean_keepdim(D::Minus1)?;
    let normed = centered.broadcast_div(&(variance + LAYER_NORM_EPS)?.sqrt()?)?;
    normed.broadcast_mul(weight)?.broadcast_add(bias)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tiny() -> ModelConfig {
        ModelConfig { vocab: VOCAB, model_dim: 16, layers: 1, heads: 2, context: 8 }
    }

    #[test]
    fn initial_params_are_a_function_of_the_seed() {
        let config = tiny();
        let a = initial_params(&config, 7);
        assert_eq!(a.len(), config.param_count());
        assert_eq!(a, initial_params(&config, 7));
        assert_ne!(a, initial_params(&config, 8));
    }

    #[test]
    fn gradients_cover_every_parameter_in_order() {
        let config = tiny();
        let model = Gpt::new(config, &initial_params(&config, 1), &Device::Cpu).unwrap();
        let inputs: Vec<u32> = (0..16).map(|i| (i * 7 % 256) as u32).collect();
        let targets: Vec<u32> = (0..16).map(|i| (i * 11 % 256) as u32).collect();
        let mut grads = Vec::new();
        let loss = model.loss_and_grads(&inputs, &targets, 2, &mut grads).unwrap();
        assert_eq!(grads.len(), config.param_count());
        // Near ln(256) for an untrained model.
        assert!((loss - (VOCAB as f32).ln()).abs() < 0.5, "loss {loss}");
        assert!(grads.iter().all(|g| g.is_finite()));
        assert!(grads.iter().any(|g| *g != 0.0));
    }

    #[test]
    fn config_problems_name_the_flags() {
        let config = ModelConfig { vocab: VOCAB, model_dim: 10, layers: 0, heads: 3, context: 1 };
        let problems = config.problems().join("\n");
        assert!(problems.contains("--layers"), "{problems}");
        assert!(problems.contains("--heads"), "{problems}");
        assert!(problems.contains("--context"), "{problems}");
    }
}
