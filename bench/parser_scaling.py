"""Tool-call parser scaling: parse time of adversarial replies (JSON-looking fragments that are no calls)
at 64 KB and 512 KB, side by side.  Linear parsing gives a 512/64 time ratio near 8; the old retry loop
was quadratic (ratio near 64; 17 s for the single-quoted pattern at 512 KB on the 2-core dev machine).

    PYTHONPATH=. python bench/parser_scaling.py
"""

from __future__ import annotations

import json
import time

from workbench.formats.parser import parse_tool_calls

PATTERNS = {
    "open_json_calls": '{"name": "f", "parameters": {"a": ',
    "single_quoted": "{\"name\": 'x', ",
    "json_list_starts": '[{"name": "g", ',
    "mixed": '{"type": "function", "x": [1, 2 text {"name": "h"} more ',
}


def seconds(text: str, repeats: int = 3) -> float:
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        parse_tool_calls(text)
        best = min(best, time.perf_counter() - start)
    return best


def main() -> None:
    results = {}
    for name, piece in PATTERNS.items():
        small = seconds(piece * (64 * 1024 // len(piece)))
        large = seconds(piece * (512 * 1024 // len(piece)))
        results[name] = {"64KB_s": round(small, 4), "512KB_s": round(large, 4), "ratio": round(large / small, 1)}
        print(f"{name:18s} 64 KB {small:7.3f} s   512 KB {large:7.3f} s   ratio {large / small:5.1f} (linear ~8)")
    print(json.dumps({"bench": "parser_scaling", "results": results}))


if __name__ == "__main__":
    main()
