"""Plain-torch model definitions of the zoo, each a chain of blocks.

:mod:`executor.profiling.models.cnn` holds the image classifiers (ResNet, MobileNetV2,
EfficientNet-B0, VGG-16) and :mod:`executor.profiling.models.transformer` the BERT-style
encoder and the GPT-2-style decoder. Every builder returns a list of ``(block name,
factory)`` pairs (:data:`executor.profiling.models.blocks.BlockSpec`) so that a pipeline
stage can construct only its own blocks; the registry, sizes and initialisation live in
:mod:`executor.profiling.zoo`.
"""
