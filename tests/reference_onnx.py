"""Reference for tests/test_onnx.cpp: checks an exported ONNX file with onnx's full checker and runs it in onnxruntime.

usage: reference_onnx.py MODEL.onnx INPUTS.safetensors OUTPUTS.safetensors

Every tensor X in INPUTS is fed as `pixel_values`; each graph output Y comes back as "X/Y" in OUTPUTS. Prints one
JSON object describing the file: ir_version, opsets, producer, metadata_props (in order), inputs and outputs with
their shapes (a symbolic dim as its name).
"""
import json
import sys

import numpy as np
import onnx
import onnxruntime
from safetensors.numpy import load_file, save_file


def dims(value_info):
    return [d.dim_param if d.HasField("dim_param") else d.dim_value for d in value_info.type.tensor_type.shape.dim]


def main(model_path, inputs_path, outputs_path):
    onnx.checker.check_model(model_path, full_check=True)
    model = onnx.load(model_path)
    session = onnxruntime.InferenceSession(model_path, providers=["CPUExecutionProvider"])
    names = [o.name for o in session.get_outputs()]
    results = {}
    for key, pixels in load_file(inputs_path).items():
        for name, value in zip(names, session.run(names, {"pixel_values": pixels})):
            results[f"{key}/{name}"] = np.ascontiguousarray(value, dtype=np.float32)
    save_file(results, outputs_path)
    print(json.dumps({
        "ir_version": model.ir_version,
        "opsets": {o.domain: o.version for o in model.opset_import},
        "producer": [model.producer_name, model.producer_version],
        "metadata_props": [[p.key, p.value] for p in model.metadata_props],
        "inputs": [{"name": i.name, "shape": dims(i)} for i in model.graph.input],
        "outputs": [{"name": o.name, "shape": dims(o)} for o in model.graph.output],
    }))


if __name__ == "__main__":
    if len(sys.argv) != 4:
        sys.exit(__doc__)
    main(*sys.argv[1:])
