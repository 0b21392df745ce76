/* graph_models.h — bench_graph's compute-bound models (graph_models.c): bench_train_step's MLP
 * 784-1024-1024-10 and ResNet-50, eagerly and replayed, and the command line of bench_graph. */
#ifndef CLPAR_BENCH_GRAPH_MODELS_H
#define CLPAR_BENCH_GRAPH_MODELS_H

typedef enum { BENCH_MODEL_LATENCY, BENCH_MODEL_MLP784, BENCH_MODEL_RESNET50 } bench_model_kind;

/* bench_graph's arguments: [steps [rounds]] --model latency|mlp784|resnet50 --optim sgd|adam;
 * steps and rounds 0 where not given (each model's default), adam -1 where not given (the
 * model's optimizer in bench_train_step: Adam for the MLP, SGD for ResNet-50). */
typedef struct {
  bench_model_kind kind;
  int steps, rounds, adam;
} bench_model_args;

/* Parses argv into *a; 0 (the usage on stderr) on an unknown or malformed argument. */
int bench_model_parse(int argc, char **argv, bench_model_args *a);

/* Times a->kind's step eagerly and replayed on device 0 and prints one JSON object; clpar is
 * initialized. Returns 1 on success. */
int bench_model_run(const bench_model_args *a);

#endif
