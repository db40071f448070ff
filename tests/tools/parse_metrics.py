"""Parses an OpenMetrics exposition with the Prometheus project's own parser (strict: a
malformed line fails) and prints its samples as JSON: [[name, {labels}, value], ...].

Usage: python3 parse_metrics.py FILE. Needs `pip install prometheus-client` (.ci/run does)."""
import json
import sys

from prometheus_client.openmetrics.parser import text_string_to_metric_families

text = open(sys.argv[1], encoding="utf-8").read()
samples = []
for family in text_string_to_metric_families(text):
    for sample in family.samples:
        samples.append([sample.name, sample.labels, sample.value])
print(json.dumps(samples))
