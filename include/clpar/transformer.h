/* transformer.h — the layers of a transformer and GPT-2: Embedding, LayerNorm, Dropout,
 * causal self-attention, the MLP and the pre-norm block, each as a differentiable function
 * and as a module with PyTorch's (nanoGPT's) names and initialization. */
#ifndef CLPAR_TRANSFORMER_H
#define CLPAR_TRANSFORMER_H

#include <stdint.h>

#include "export.h"
#include "nn.h"
#include "status.h"
#include "tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

/* F.embedding(indices, weight): indices an int32 or int64 tensor of any shape on weight's
 * device, weight [num, dim]; out is indices' shape + [dim]. An index outside 0 .. num-1 is
 * not checked on the host (that would wait for the device): its row is NaN and it adds
 * nothing to the gradient. The weight's gradient is a deterministic scatter-add (the same
 * bits on every run, repeated indices included). */
CLPAR_API clpar_status clpar_embedding(const clpar_tensor *indices, const clpar_tensor *weight,
                                       clpar_tensor **out);
/* nn.Embedding(num, dim): parameter "weight" [num, dim], standard normal; its forward takes
 * the int indices tensor. */
CLPAR_API clpar_status clpar_embedding_create(int64_t num_embeddings, int64_t embedding_dim,
                                              clpar_device *dev, clpar_module **out);

/* F.layer_norm(x, [x.shape[-1]], weight, bias, eps) over the last dimension; weight and bias
 * [dim] or NULL. Variance biased, computed from deviations from the mean. */
CLPAR_API clpar_status clpar_layer_norm(const clpar_tensor *x, const clpar_tensor *weight,
                                        const clpar_tensor *bias, float eps, clpar_tensor **out);
/* nn.LayerNorm(dim, eps, bias=bias != 0): "weight" ones, "bias" zeros. eps 0 gives PyTorch's
 * 1e-5 (CLPAR_ZERO for a literal 0). */
CLPAR_API clpar_status clpar_layernorm_create(int64_t dim, float eps, int bias, clpar_device *dev,
                                              clpar_module **out);

/* F.dropout(x, p, training): with training set and p > 0, each element is zeroed with
 * probability p and the others scaled by 1 / (1 - p); otherwise x itself (a view). The mask
 * is a pure function of (seed, offset + element index), the same on every backend and when
 * recomputed; p in [0, 1]. */
CLPAR_API clpar_status clpar_dropout(const clpar_tensor *x, float p, int training, uint64_t seed,
                                     uint64_t offset, clpar_tensor **out);
/* nn.Dropout(p) (p as given; PyTorch's default is 0.5). The module's seed is drawn from the
 * parameter seed stream when it is made (clpar_manual_seed fixes it); each training forward
 * uses the current offset and advances it by the input's numel. Identity in eval mode. */
CLPAR_API clpar_status clpar_dropout_create(float p, clpar_module **out);
/* A Dropout module's seed and offset, to replay or resume a run's masks. */
CLPAR_API clpar_status clpar_dropout_set_state(clpar_module *m, uint64_t seed, uint64_t offset);
CLPAR_API clpar_status clpar_dropout_get_state(const clpar_module *m, uint64_t *seed,
                                               uint64_t *offset);

/* The size of nanoGPT's blocks: width n_embd (a multiple of n_head), dropout probability
 * (0 for none), bias: Linear and LayerNorm biases (GPT-2 has them). */
typedef struct clpar_block_config {
  int64_t n_embd, n_head;
  float dropout;
  int bias;
} clpar_block_config;

/* nanoGPT's CausalSelfAttention on x [B, T, n_embd]: children "c_attn" (Linear n_embd ->
 * 3 n_embd, q, k, v side by side), "c_proj" (Linear n_embd -> n_embd), "attn_dropout" and
 * "resid_dropout"; softmax(q k^T / sqrt(head_dim), causal) v per head. Linear's own
 * initialization (uniform); clpar_gpt_create sets GPT-2's. */
CLPAR_API clpar_status clpar_causal_self_attention_create(const clpar_block_config *config,
                                                          clpar_device *dev, clpar_module **out);
/* nanoGPT's MLP: "c_fc" (n_embd -> 4 n_embd), exact GELU, "c_proj" (4 n_embd -> n_embd),
 * "dropout". */
CLPAR_API clpar_status clpar_mlp_create(const clpar_block_config *config, clpar_device *dev,
                                        clpar_module **out);
/* nanoGPT's pre-norm Block: x + attn(ln_1(x)), then + mlp(ln_2(x)); children "ln_1", "attn",
 * "ln_2", "mlp". */
CLPAR_API clpar_status clpar_transformer_block_create(const clpar_block_config *config,
                                                      clpar_device *dev, clpar_module **out);

/* nanoGPT's GPTConfig: context block_size, vocabulary, layers, heads, width (a multiple of
 * n_head), dropout probability and bias (GPT-2: 1024, 50257 (50304 padded), 12, 12, 768,
 * 0.0, 1). */
typedef struct clpar_gpt_config {
  int64_t block_size, vocab_size, n_layer, n_head, n_embd;
  float dropout;
  int bias;
} clpar_gpt_config;

/* nanoGPT's GPT under GPT-2's names: transformer.wte.weight [V, C], transformer.wpe.weight
 * [block_size, C], transformer.h.<i>.{ln_1, attn.c_attn, attn.c_proj, ln_2, mlp.c_fc,
 * mlp.c_proj}.{weight, bias}, transformer.ln_f.{weight, bias}, and lm_head.weight, the same
 * tensor as wte's (listed once, under transformer.wte.weight, as safetensors and
 * parameters() list a tied weight). Linear weights are nn.Linear's [out, in] (HF's GPT-2
 * stores Conv1D weights [in, out]: clpar_gpt_load_hf transposes them). GPT-2's initialization:
 * weights normal(0, 0.02), the c_proj weights normal(0, 0.02 / sqrt(2 n_layer)), biases 0,
 * LayerNorms 1 and 0, from the parameter seed stream. Forward: int32 or int64 token ids [B, T], T
 * <= block_size, on the model's device, to logits [B, T, vocab_size]. */
CLPAR_API clpar_status clpar_gpt_create(const clpar_gpt_config *config, clpar_device *dev,
                                        clpar_module **out);

/* Loads a GPT-2 checkpoint in Hugging Face's layout (a safetensors file of GPT2LMHeadModel,
 * "transformer.h.0.attn.c_attn.weight", ..., or of the hub's GPT2Model, "h.0.attn.c_attn.weight")
 * into gpt, a clpar_gpt_create model of the same configuration. HF's GPT2 stores the weights
 * of attn.c_attn, attn.c_proj, mlp.c_fc and mlp.c_proj as Conv1D's [in, out]: each is
 * transposed into nn.Linear's [out, in]; every other tensor is copied as it is. The file's
 * h.<i>.attn.bias and h.<i>.attn.masked_bias (HF's causal masks) and lm_head.weight (tied to
 * wte) are skipped. Any tensor of the GPT that the file lacks, any other name in the file, or
 * a shape that differs is CLPAR_ERROR_SHAPE_MISMATCH naming them, and nothing is changed. */
CLPAR_API clpar_status clpar_gpt_load_hf(clpar_module *gpt, const char *path);

/* The GPT of clpar_gpt_create cut into n_stages modules (1 <= n_stages <= n_layer) on dev, for
 * clpar_pipeline_create: stage k runs blocks [n_layer k / n_stages, n_layer (k+1) / n_stages);
 * the first also embeds token ids [B, T] (wte, wpe, drop), the last also runs ln_f and the
 * head; the others take and give [B, T, n_embd]. Inside a stage the parameters keep GPT-2's
 * names (transformer.h.<i> with i the block's index in the whole model). The head is tied to
 * the first stage's wte: the last stage holds no copy of it, and its forward copies wte to its
 * own device each time (a differentiable copy), so wte's gradient sums both uses as on one
 * device. Weights and Dropout seeds are those clpar_gpt_create gives from the same parameter
 * seed stream position (one is made and copied), so a pipeline of the stages trains as the
 * one-device GPT. stages: room for n_stages modules, owned by the caller (or the pipeline). */
CLPAR_API clpar_status clpar_gpt_create_stages(const clpar_gpt_config *config, int n_stages,
                                               clpar_device *dev, clpar_module **stages);

#ifdef __cplusplus
}
#endif
#endif
