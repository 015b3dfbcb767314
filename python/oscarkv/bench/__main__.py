"""python -m oscarkv.bench {model,quality} [options]"""
import argparse
import json
import sys


def main() -> int:
    if len(sys.argv) < 2 or sys.argv[1] not in ("model", "quality"):
        print(__doc__.strip())
        print("  model    model-level decode / max-batch throughput / TTFT on the GPU "
              "(python -m oscarkv.bench model --help)")
        print("  quality  bits per byte of a model through transformers + oscarkv pages")
        return 2
    cmd, rest = sys.argv[1], sys.argv[2:]
    if cmd == "model":
        from .model import main as model_main
        return model_main(rest)
    ap = argparse.ArgumentParser(prog="python -m oscarkv.bench quality")
    ap.add_argument("--model", required=True)
    ap.add_argument("--text", required=True)
    ap.add_argument("--codec", default="hadamard", help="naive or hadamard (or --rotations)")
    ap.add_argument("--rotations", default="", help="rotation artifact of `oscarkv calibrate`")
    ap.add_argument("--windows", type=int, default=16)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--device", default="cuda")
    a = ap.parse_args(rest)
    from .quality import evaluate
    print(json.dumps(evaluate(a.model, a.text, a.codec, a.windows, seed=a.seed, device=a.device,
                              rotations=a.rotations)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
