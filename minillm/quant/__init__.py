"""Weight-only quantization: `LLM(model, quantization="int8" | "int4")`.

int8.py and int4.py hold the formulas (quantize, pack, dequantize) in plain PyTorch, and
matmul_reference.py the matmuls built on them: they import nothing of minillm above this package, so
the kernels build on them too. compressed_tensors.py and awq.py read INT4 checkpoints written by
other tools (llm-compressor, AutoAWQ) into int4.py's layout. layers/quant_linear.py, a layer above
the kernels, holds the layer that stores the packed weights (and runs either matmul) and the function
that swaps a model's linear layers for it; models/quant_loading.py fills those layers from a
checkpoint, quantizing as the weights arrive.
"""

QUANTIZATION_METHODS = ("int8", "int4")
INT4_GROUP_SIZES = (32, 64, 128)
