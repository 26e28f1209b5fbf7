"""Decodes one OTLP ExportProfilesServiceRequest with the official Python `opentelemetry-proto`
package (whichever generation the running venv has installed) and prints its facts as JSON,
so ember's encoders are checked against definitions that are not ember's own.

Usage: otlp_decode.py REQUEST_FILE   (the uncompressed protobuf bytes)

Output: {"package_version", "sample_fields", "period", "sample_type", "period_type",
         "resources": [{"attributes": {k: v}, "samples": [{"count", "stack": [leaf..root],
         "attributes": {k: v}}]}]}
"""
import importlib.metadata
import json
import sys

from opentelemetry.proto.collector.profiles.v1development import profiles_service_pb2
from opentelemetry.proto.profiles.v1development import profiles_pb2


def any_value(v):
    kind = v.WhichOneof("value")
    return None if kind is None else getattr(v, kind)


def main():
    with open(sys.argv[1], "rb") as f:
        data = f.read()
    req = profiles_service_pb2.ExportProfilesServiceRequest()
    req.ParseFromString(data)
    d = req.dictionary
    strings = list(d.string_table)

    def attrs(indices):
        out = {}
        for i in indices:
            # A message of the other generation yields indexes out of range: show, don't fail.
            if not 0 <= i < len(d.attribute_table):
                out["<bad attribute index %d>" % i] = None
                continue
            a = d.attribute_table[i]
            out[strings[a.key_strindex]] = any_value(a.value)
        return out

    def frame_names(location_index):
        if not 0 <= location_index < len(d.location_table):
            return ["<bad location index %d>" % location_index]
        loc = d.location_table[location_index]
        if not loc.lines:
            return ["[unknown]"]
        return [strings[d.function_table[line.function_index].name_strindex] for line in loc.lines]

    result = {
        "package_version": importlib.metadata.version("opentelemetry-proto"),
        "sample_fields": {f.name: f.number for f in profiles_pb2.Sample.DESCRIPTOR.fields},
        "empty_first": {
            "string": strings[:1] == [""],
            "function": len(d.function_table) > 0 and d.function_table[0].name_strindex == 0,
            "location": len(d.location_table) > 0 and len(d.location_table[0].lines) == 0,
            "mapping": len(d.mapping_table) > 0 and d.mapping_table[0].filename_strindex == 0,
            "stack": len(d.stack_table) > 0 and len(d.stack_table[0].location_indices) == 0,
            "attribute": len(d.attribute_table) > 0 and d.attribute_table[0].key_strindex == 0,
        },
        "resources": [],
    }
    for rp in req.resource_profiles:
        resource = {
            "attributes": {kv.key: any_value(kv.value) for kv in rp.resource.attributes},
            "samples": [],
        }
        for sp in rp.scope_profiles:
            for p in sp.profiles:
                result["period"] = p.period
                result["sample_type"] = [strings[p.sample_type.type_strindex], strings[p.sample_type.unit_strindex]]
                result["period_type"] = [strings[p.period_type.type_strindex], strings[p.period_type.unit_strindex]]
                for s in p.samples:
                    stack = []
                    locations = d.stack_table[s.stack_index].location_indices if 0 <= s.stack_index < len(d.stack_table) else []
                    for li in locations:
                        stack.extend(frame_names(li))
                    resource["samples"].append({
                        "count": sum(s.values),
                        "values": list(s.values),
                        "stack": stack,
                        "attributes": attrs(s.attribute_indices),
                    })
        result["resources"].append(resource)
    json.dump(result, sys.stdout)


if __name__ == "__main__":
    main()
