"""Reference architectures, Fashion-MNIST splits, the model registry and head/tail partitioning."""
