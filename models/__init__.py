"""Reference architectures, Fashion-MNIST splits, preprocessing and data sources, the model registry
and head/tail partitioning."""
