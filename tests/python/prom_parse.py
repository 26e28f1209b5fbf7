"""Parses a Prometheus text exposition (stdin) with the official Python client's parser
(`prometheus_client.parser`, PyPI) and prints its families as JSON, for tests/tests/metrics.rs:
{"families": [{"name", "type", "help", "samples": [{"name", "labels", "value"}]}]}.
A text the parser refuses exits non-zero with its error."""

import json
import math
import sys

from prometheus_client.parser import text_string_to_metric_families


def main() -> None:
    families = []
    for family in text_string_to_metric_families(sys.stdin.read()):
        families.append(
            {
                "name": family.name,
                "type": family.type,
                "help": family.documentation,
                "samples": [
                    {
                        "name": sample.name,
                        "labels": sample.labels,
                        # JSON has no NaN or infinities.
                        "value": sample.value if math.isfinite(sample.value) else str(sample.value),
                    }
                    for sample in family.samples
                ],
            }
        )
    json.dump({"families": families}, sys.stdout)


if __name__ == "__main__":
    main()
