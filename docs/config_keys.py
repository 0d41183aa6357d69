"""One line per config key: the descriptions of docs/configuration.md.

`DESCRIPTIONS` maps every dotted key of every config (`bert_jax.train.config.config_keys`),
sections included, to one line. tests/test_config_reference.py fails when a config has a key
missing here or when a key here is in no config; `python docs/make_config_reference.py`
rewrites the page from these lines and the configs' values. A line says what the key does
and what its special values mean, as the code that reads it does; defaults come from the
configs, so they are not repeated here. Task keys name the task kinds that read them.
"""

DESCRIPTIONS = {
    # --- train: bert_jax/train/loop.py, bert_jax/tasks/finetune.py ---------------------
    "train": "The run: batch sizes, its length, seed, logging, evaluation, warm start, "
             "profiling.",
    "train.batch_size": "Global examples per optimizer step, over all processes (each reads "
                        "its share).",
    "train.eval_batch_size": "Global examples per evaluation batch; 0: `batch_size`.",
    "train.steps": "Optimizer steps of the run; <= 0: from `epochs` (fine-tuning only).",
    "train.epochs": "Passes over the training set when `steps` <= 0 (fine-tuning).",
    "train.seed": "Parameter init and dropout (fine-tuning: and the example order); a workdir "
                  "resumes only with its own seed.",
    "train.accum_steps": "Micro-batches per step (gradient accumulation); `batch_size` stays "
                         "the whole step's batch.",
    "train.log_every": "Steps between logged training metrics (metrics.jsonl, TensorBoard, "
                       "progress bar).",
    "train.eval_every": "N > 0: evaluate every N steps and at the end; 0: at the end only; "
                        "< 0: never.",
    "train.eval_steps": "Batches per evaluation; -1: the whole eval set (fine-tuning "
                        "requires -1).",
    "train.init_checkpoint": "Warm start: a model directory, a Hugging Face directory or a "
                             "training workdir (fine-tuning: the pretrained encoder).",
    "train.init_state": "`params`: the weights only; `full`: a workdir's weights, optimizer "
                        "state, step and RNG (phase 2).",
    "train.init_extend_positions": "Warm start with more positions than the checkpoint: "
                                   "`repeat` repeats the learned rows; empty: refused.",
    "train.init_extend_vocab": "Warm start with a vocabulary extending the checkpoint's: "
                               "`mean` averages a new entry's old pieces; empty: refused.",
    "train.random_init": "Fine-tuning control run: the checkpoint's architecture with fresh "
                         "random weights.",
    "train.do_train": "Fine-tuning: False evaluates and predicts with a fine-tuned "
                      "`init_checkpoint`, no training.",
    "train.skip_nonfinite": "On a non-finite loss or gradient, False stops naming the step; "
                            "True skips that update.",
    "train.deterministic": "True: no dropout (tests, debugging).",
    "train.tensorboard": "TensorBoard events in WORKDIR/tensorboard (metrics.jsonl is always "
                         "written).",
    "train.profile_steps": "Steps traced by jax.profiler into WORKDIR/profile (process 0); "
                           "0: none.",
    "train.profile_start": "Steps after the start (or restart) before the trace begins.",
    "train.accept_setting_changes": "True: warm-start or resume with `hidden_act`, "
                                    "`layer_norm_eps`, casing... other than the checkpoint's.",
    "train.heartbeat_timeout": "Several processes: seconds of silence after which a process "
                               "is lost and every other one stops, in one line each.",

    # --- schedule: bert_jax/optim.py make_schedule ---------------------------------------
    "schedule": "The learning rate: a linear warmup from 0 to `lr`, then a decay to `end_lr`.",
    "schedule.lr": "Peak learning rate (`sweep.lrs` replaces it run by run).",
    "schedule.warmup_steps": "Warmup steps; < 0: `warmup_ratio` of the schedule's steps.",
    "schedule.warmup_ratio": "Warmup as a fraction (0 to 1) of the schedule's steps, used when "
                             "`warmup_steps` < 0.",
    "schedule.decay": "After warmup: `linear`, `polynomial` (with `power`), `cosine` or "
                      "`constant`.",
    "schedule.power": "Exponent of the `polynomial` decay (`linear` is power 1).",
    "schedule.end_lr": "Learning rate at the end of the decay.",
    "schedule.decay_from": "`peak`: decay over the steps after warmup (Hugging Face); `start`: "
                           "over all steps from step 0 (google-research/bert).",
    "schedule.total_steps": "Steps the schedule spans; -1: the run's steps (phase 2 continues "
                            "phase 1's 1M-step schedule).",

    # --- optimizer: bert_jax/optim.py make_optimizer -------------------------------------
    "optimizer": "The optimizer; weight decay and LAMB's trust ratio skip biases and "
                 "LayerNorm.",
    "optimizer.name": "`adamw` (optax.adamw) or `lamb` (as NVIDIA's and Google's BERT "
                      "recipes).",
    "optimizer.b1": "Adam's first-moment decay.",
    "optimizer.b2": "Adam's second-moment decay.",
    "optimizer.eps": "Adam's epsilon.",
    "optimizer.weight_decay": "Decoupled weight decay, on kernels and embeddings only.",
    "optimizer.bias_correction": "Adam's bias correction (Hugging Face, optax); False: "
                                 "without, as google-research/bert's optimizer.",
    "optimizer.clip_norm": "Clip the gradient's global norm to this; <= 0: no clipping.",
    "optimizer.layer_decay": "Layer-wise rate decay: layer i of L takes decay^(L-i) of the "
                             "rate, the embeddings decay^(L+1); 1: off.",

    # --- mesh: bert_jax/sharding.py ------------------------------------------------------
    "mesh": "The device mesh (data x fsdp x tensor) and how logical axes map onto it.",
    "mesh.data": "Data-parallel axis size; -1: the devices the other axes leave.",
    "mesh.fsdp": "Axis that shards parameters and optimizer state (and the batch); -1: the "
                 "devices left.",
    "mesh.tensor": "Tensor-parallel axis size (heads, FFN, vocabulary); -1: the devices left.",
    "mesh.rules": "Logical axis -> mesh axes, as [name, axis or [axes] or None] pairs "
                  "(bert_jax/sharding.py).",

    # --- checkpoint: bert_jax/train/checkpoint.py ----------------------------------------
    "checkpoint": "Checkpoints in WORKDIR/checkpoints: the same command again resumes from "
                  "the latest; a SIGTERM saves and exits.",
    "checkpoint.every": "Save every N steps and at the end; 0: at the end only.",
    "checkpoint.keep": "Most recent checkpoints kept; <= 0: all.",
    "checkpoint.keep_period": "Also keep every checkpoint whose step is a multiple of N; "
                              "0: none.",
    "checkpoint.async_save": "Write checkpoints in the background while training goes on.",
    "checkpoint.timeout": "Seconds one save may take on every process, its wait for the "
                          "others included; past it the save fails.",

    # --- sweep: bert_jax/tasks/finetune.py -----------------------------------------------
    "sweep": "Fine-tuning's restarts x learning rates; the best run on the first dev set is "
             "kept.",
    "sweep.lrs": "Learning rates to try, e.g. (5e-5, 3e-5, 2e-5); empty: `schedule.lr` alone.",
    "sweep.restarts": "Runs per learning rate, with seeds `train.seed` to `train.seed + "
                      "restarts - 1`.",
    "sweep.save_best_model": "Save the best run as a model directory in WORKDIR/best_model.",
    "sweep.delete_finished": "Delete a finished run's checkpoints once its results are "
                             "recorded (one process only).",

    # --- model: bert_jax/models/config.py BertConfig -------------------------------------
    "model": "The encoder (BertConfig); fine-tuning uses it only without `init_checkpoint`.",
    "model.vocab_size": "Token embedding rows: at least the vocabulary's size.",
    "model.hidden_size": "Width of the hidden states (H).",
    "model.num_hidden_layers": "Transformer layers (L).",
    "model.num_attention_heads": "Attention heads (A); they divide `hidden_size`.",
    "model.intermediate_size": "Inner width of the feed-forward block (4H in the paper).",
    "model.hidden_act": "FFN activation: gelu, gelu_new, gelu_tanh, relu, tanh or silu.",
    "model.hidden_dropout_prob": "Dropout on the embeddings and each sub-layer's output.",
    "model.attention_probs_dropout_prob": "Dropout on the attention probabilities.",
    "model.max_position_embeddings": "Position embedding rows: the longest sequence the "
                                     "model takes.",
    "model.type_vocab_size": "Segment (token type) embedding rows; 0: none (token types "
                             "ignored).",
    "model.initializer_range": "Standard deviation of the truncated-normal weight init.",
    "model.layer_norm_eps": "LayerNorm epsilon.",
    "model.pre_ln": "LayerNorm before each sub-layer (and a final one) instead of after.",
    "model.dtype": "Compute dtype: auto (bfloat16 when the step compiles for a GPU or TPU, "
                   "float32 on CPU), float32, bfloat16 or float16.",
    "model.fp8": "The encoder's dense products in FP8 with delayed scaling (Hopper-class "
                 "GPUs; emulated elsewhere): docs/accelerators.md.",
    "model.param_dtype": "Storage dtype of the parameters.",
    "model.remat": "What a layer keeps for the backward pass: none, full, minimal, "
                   "minimal_ffn, dots_saveable, dots_with_no_batch_dims_saveable.",
    "model.scan_layers": "Run the layers with nn.scan (stacked parameters): compile time "
                         "independent of depth.",
    "model.scan_unroll": "Scanned layers per loop step: 1 a loop, 0 all unrolled (longer "
                         "compile), auto: 1 on TPU, 0 elsewhere. Same params.",
    "model.dropout_rng": "Dropout masks: `hash` (counter-based, the same on any mesh) or "
                         "`jax` (flax's nn.Dropout).",
    "model.attention": "Attention kernel: auto, xla, cudnn or pallas.",
    "model.fused_qkv": "Q, K and V in one matrix product (the same parameters).",
    "model.pallas_block_q": "Pallas GPU kernel: forward query block, a power of two >= 16; 0: "
                            "128 (speed only, same results).",
    "model.pallas_block_k": "Pallas GPU kernel: forward key block, a power of two >= 16; 0: 64.",
    "model.pallas_bwd_block_q": "Pallas GPU kernel: backward query block; 0: `pallas_block_q` if "
                                "set, else 64.",
    "model.pallas_bwd_block_k": "Pallas GPU kernel: backward key block; 0: `pallas_block_k` if "
                                "set, else 64.",
    "model.pallas_num_warps": "Pallas GPU kernel: Triton warps per program, a power of two <= "
                              "32; 0: 4.",
    "model.pallas_num_stages": "Pallas GPU kernel: Triton pipelining stages, >= 1; 0: 2.",
    "model.pallas_bwd_num_warps": "Pallas GPU kernel: Triton warps of the backward kernels; "
                                  "0: `pallas_num_warps`.",
    "model.pallas_bwd_num_stages": "Pallas GPU kernel: Triton stages of the backward kernels; "
                                   "0: `pallas_num_stages`.",
    "model.gelu_backward": "FFN bias + GELU backward: `auto` (a Pallas kernel on GPU in "
                           "bf16/fp16, else XLA), `xla`, `pallas`. Speed only.",
    "model.residual_norm": "Post-LN bias + dropout + residual + LayerNorm: `auto` (Pallas "
                           "kernels on GPU in bf16/fp16, remat none), `xla`, `pallas`.",
    "model.position_embedding": "`learned` (a position table, BERT) or `rotary` (queries and "
                                "keys rotated by position, no table).",
    "model.rope_theta": "Rotary base of the global layers.",
    "model.local_rope_theta": "Rotary base of the local (sliding-window) layers.",
    "model.ffn_type": "`dense` (BERT's FFN) or a gated FFN: `geglu` (hidden_act a GELU) or "
                      "`swiglu` (hidden_act silu).",
    "model.use_bias": "Biases of the dense layers (attention, FFN, pooler, MLM transform); "
                      "False: none.",
    "model.norm_bias": "LayerNorm biases; False: scale only.",
    "model.layer0_attention_norm": "Pre-LN: False leaves out layer 0's attention LayerNorm "
                                   "(ModernBERT).",
    "model.pooler": "The tanh pooler on [CLS]; False: the pooled output is the [CLS] hidden "
                    "state.",
    "model.global_attn_every_n_layers": "N > 1: layer i is global when i % N == 0, else "
                                        "local; 0 or 1: every layer global.",
    "model.local_attention": "Window of the local layers: keys within `local_attention // 2` "
                             "of the query; 0: no local layers.",
    "model.init_scheme": "Weight init: `bert` (initializer_range for all) or `modernbert` "
                         "(outputs / sqrt(2 L), classifiers hidden_size ** -0.5).",
    "model.nsp": "Pre-training: train the next-sentence head too; False: masked LM only.",

    # --- data: bert_jax/data/pretrain.py data_config -------------------------------------
    "data": "Pre-training input: TFRecords, raw text made into TFRecords, or synthetic "
            "batches.",
    "data.source": "`tfrecord` (files) or `synthetic` (random batches of the same shapes).",
    "data.train_files": "Training TFRecords, comma-separated globs (gs:// works); empty: "
                        "built from `text_files`.",
    "data.eval_files": "Eval TFRecords, comma-separated globs; empty: no evaluation (unless "
                       "built from text).",
    "data.text_files": "Raw text globs (a sentence per line, documents split by a blank line) "
                       "made into TFRecords; empty: the sample corpus.",
    "data.do_lower_case": "Lower-case `text_files` while building (uncased vocabularies).",
    "data.max_seq_length": "Tokens per sequence; the files' length.",
    "data.max_predictions_per_seq": "Masked-token slots per sequence; the files' (a packed "
                                    "row has K more).",
    "data.pack": "Pack several sequences per row in the TFRecords the run builds from text.",
    "data.max_sequences_per_pack": "K: the most sequences a packed row holds.",
    "data.shuffle": "Shuffle the files and records of the training set.",
    "data.shuffle_buffer": "Records per shuffle window, per host.",
    "data.seed": "Seed of the file order, the shuffle and dynamic masking.",
    "data.num_parallel_reads": "Files read at once (interleave cycle length).",
    "data.interleave_block": "Consecutive records taken from one file at a time.",
    "data.read_threads": "Interleave threads: -1 auto, 0 the pipeline's own thread, N, or -2 "
                         "tf.data's AUTOTUNE.",
    "data.read_buffer_bytes": "Read buffer per TFRecord file, in bytes.",
    "data.autotune": "Turn on tf.data's autotuning model (its untuned defaults already keep "
                     "up).",
    "data.dynamic_masking": "Mask anew each time a sequence is read (RoBERTa) instead of the "
                            "files' masks; unpacked files only.",
    "data.masked_lm_prob": "Share of tokens masked by `dynamic_masking`.",
    "data.vocab_file": "WordPiece vocab.txt or SentencePiece .model, for building, dynamic "
                       "masking and the id checks; empty: the ids below.",
    "data.vocab_size": "Vocabulary size when `vocab_file` is empty.",
    "data.pad_id": "[PAD] id when `vocab_file` is empty.",
    "data.cls_id": "[CLS] id when `vocab_file` is empty.",
    "data.sep_id": "[SEP] id when `vocab_file` is empty.",
    "data.mask_id": "[MASK] id when `vocab_file` is empty.",
    "data.unk_id": "[UNK] id when `vocab_file` is empty (the input check measures its share).",
    "data.skip_corrupt": "Leave corrupt shards out with a warning instead of stopping.",
    "data.check_records_per_file": "Records of each file checked against the config before "
                                   "anything compiles.",
    "data.prefetch_to_device": "Batches put on the devices ahead of the step.",

    # --- task: bert_jax/tasks/registry.py task_from_config, one class per kind -----------
    "task": "The fine-tuning task; `kind` picks the class, the other keys are its "
            "arguments.",
    "task.kind": "glue, squad, ner or choice (set by the config file).",
    "task.name": "glue: the GLUE task or `tsv` (your own TSVs); choice: swag, hellaswag or "
                 "jsonl.",
    "task.version": "squad: 1.1 or 2.0 (2.0 has questions without an answer).",
    "task.data_dir": "glue: the task's directory of GLUE TSVs; empty: tfds glue/<name> (tsv "
                     "needs it).",
    "task.train_file": "squad: SQuAD JSON; ner: CoNLL columns; choice: SWAG CSV or JSONL. "
                       "Empty: tfds, where it has the set.",
    "task.predict_file": "squad: the dev JSON, scored and predicted; empty: tfds.",
    "task.dev_file": "ner, choice: the dev file; empty: tfds (conll2003, hellaswag).",
    "task.test_file": "ner, choice: a test file, predicted (scored when labelled); optional.",
    "task.tfds_data_dir": "tensorflow-datasets data_dir when the data come from tfds; empty: "
                          "tfds's default.",
    "task.cache_dir": "Directory caching the tokenized features as TFRecords; empty: no "
                      "cache.",
    "task.max_seq_length": "Tokens per sequence (squad: per window of the context).",
    "task.labels": "glue, ner: label strings in id order; empty: the task's own (tsv: 0, 1; "
                   "ner: CoNLL-2003's).",
    "task.regression": "glue tsv: a real-valued score instead of classes.",
    "task.single_sentence": "glue: read sentence1 only (a single-sentence tsv task).",
    "task.eval_test": "glue: also predict the test split(s) into GLUE submission files.",
    "task.dev_split": "glue: the dev split to score; empty: dev (mnli: dev_matched and "
                      "dev_mismatched).",
    "task.doc_stride": "squad: tokens between the starts of a long context's windows.",
    "task.max_query_length": "squad: question tokens kept.",
    "task.n_best_size": "squad: highest start and end logits tried per window.",
    "task.max_answer_length": "squad: longest answer, in tokens.",
    "task.null_score_diff_threshold": "squad 2.0: no answer when the null score exceeds the "
                                      "best span's by more than this.",
    "task.strict": "ner: seqeval's strict IOB2 entities instead of conlleval's.",

    # --- tokenizer, model_overrides: bert_jax/tasks/finetune.py --------------------------
    "tokenizer": "Fine-tuning's WordPiece tokenizer.",
    "tokenizer.vocab_file": "vocab.txt; empty: the checkpoint's.",
    "tokenizer.do_lower_case": "Lower-case the text (uncased models).",
    "model_overrides": "Fine-tuning: BertConfig fields set on top of the checkpoint's "
                       "(or `model`'s); None keeps its value.",
    "model_overrides.hidden_dropout_prob": "As `model.hidden_dropout_prob`.",
    "model_overrides.attention_probs_dropout_prob": "As `model.attention_probs_dropout_prob`.",
    "model_overrides.dtype": "As `model.dtype` (auto by default, whatever the checkpoint's).",
    "model_overrides.fp8": "As `model.fp8` (None: the checkpoint's, off: a checkpoint "
                           "carries no FP8 state).",
    "model_overrides.param_dtype": "As `model.param_dtype`.",
    "model_overrides.remat": "As `model.remat`.",
    "model_overrides.scan_layers": "As `model.scan_layers` (not for a pre-training workdir, "
                                   "restored as saved).",
    "model_overrides.scan_unroll": "As `model.scan_unroll`.",
    "model_overrides.dropout_rng": "As `model.dropout_rng`.",
    "model_overrides.attention": "As `model.attention`.",
    "model_overrides.fused_qkv": "As `model.fused_qkv`.",
    "model_overrides.pallas_block_q": "As `model.pallas_block_q`.",
    "model_overrides.pallas_block_k": "As `model.pallas_block_k`.",
    "model_overrides.pallas_bwd_block_q": "As `model.pallas_bwd_block_q`.",
    "model_overrides.pallas_bwd_block_k": "As `model.pallas_bwd_block_k`.",
    "model_overrides.pallas_num_warps": "As `model.pallas_num_warps`.",
    "model_overrides.pallas_num_stages": "As `model.pallas_num_stages`.",
    "model_overrides.pallas_bwd_num_warps": "As `model.pallas_bwd_num_warps`.",
    "model_overrides.pallas_bwd_num_stages": "As `model.pallas_bwd_num_stages`.",
    "model_overrides.gelu_backward": "As `model.gelu_backward`.",
    "model_overrides.residual_norm": "As `model.residual_norm`.",
}
