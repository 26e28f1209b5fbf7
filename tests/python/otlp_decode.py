"""Decodes OTLP ExportProfilesServiceRequests with the official Python `opentelemetry-proto`
package (whichever generation the running venv has installed) and prints their facts as JSON,
so ember's encoders are checked against definitions that are not ember's own.

Usage: otlp_decode.py [--lenient] REQUEST_FILE...   (each the uncompressed protobuf bytes)

Every message of every request is walked: a field the definitions do not know (a misnumbered
field, or one whose wire type does not match) is listed in "unknown_fields", and unless
--lenient is given the decoder then exits with status 3 (after printing the JSON), so a field
put where this generation does not expect it cannot pass unseen. "fields_set" lists every
`Message.field` present, so a field put on a number this generation gives to another field is
visible too.

Output: {"package_version", "sample_fields", "requests": [{
           "unknown_fields": ["path", ...], "fields_set": ["Message.field", ...],
           "empty_first": {table: bool},
           "mappings": [{"filename", "attributes": {k: v}}],
           "profiles": [{"resource_attributes": {k: v}, "scope_attributes": {k: v},
                         "profile_attributes": {k: v}, "sample_type": [type, unit],
                         "period_type": [type, unit], "period", "time_unix_nano",
                         "duration_nano", "samples": [{"values": [..], "count",
                         "attributes": {k: v}, "frames": [{"function", "line", "filename",
                         "frame_type", "mapping"}] (leaf first)}]}]}]}
"""
import importlib.metadata
import json
import sys

from google.protobuf import unknown_fields as unknown
from google.protobuf.message import Message
from opentelemetry.proto.collector.profiles.v1development import profiles_service_pb2
from opentelemetry.proto.profiles.v1development import profiles_pb2


def any_value(v):
    kind = v.WhichOneof("value")
    return None if kind is None else getattr(v, kind)


def walk(message, path, unknown_out, fields_out):
    """Records unknown fields and set fields of `message` and of every message inside it."""
    if len(unknown.UnknownFieldSet(message)) > 0:
        numbers = sorted({f.field_number for f in unknown.UnknownFieldSet(message)})
        unknown_out.append("%s (%s): field numbers %s" % (path, message.DESCRIPTOR.name, numbers))
    for field, value in message.ListFields():
        fields_out.add("%s.%s" % (message.DESCRIPTOR.name, field.name))
        if field.type != field.TYPE_MESSAGE:
            continue
        if isinstance(value, Message):
            walk(value, "%s.%s" % (path, field.name), unknown_out, fields_out)
        else:
            for i, item in enumerate(value):
                walk(item, "%s.%s[%d]" % (path, field.name, i), unknown_out, fields_out)


def facts(data):
    req = profiles_service_pb2.ExportProfilesServiceRequest()
    req.ParseFromString(data)
    unknown_fields = []
    fields_set = set()
    walk(req, "request", unknown_fields, fields_set)
    d = req.dictionary
    strings = list(d.string_table)

    def string(i):
        return strings[i] if 0 <= i < len(strings) else "<bad string index %d>" % i

    def attrs(indices):
        out = {}
        for i in indices:
            # A message of the other generation yields indexes out of range: show, don't fail.
            if not 0 <= i < len(d.attribute_table):
                out["<bad attribute index %d>" % i] = None
                continue
            a = d.attribute_table[i]
            out[string(a.key_strindex)] = any_value(a.value)
        return out

    def frames(location_index):
        if not 0 <= location_index < len(d.location_table):
            return [{"function": "<bad location index %d>" % location_index}]
        loc = d.location_table[location_index]
        common = {
            "frame_type": attrs(loc.attribute_indices).get("profile.frame.type"),
            "mapping": loc.mapping_index,
        }
        if not loc.lines:
            return [dict(common, function="[unknown]", line=0, filename="")]
        out = []
        for line in loc.lines:
            if not 0 <= line.function_index < len(d.function_table):
                out.append(dict(common, function="<bad function>", line=line.line, filename=""))
                continue
            f = d.function_table[line.function_index]
            out.append(dict(common, function=string(f.name_strindex), line=line.line,
                            filename=string(f.filename_strindex)))
        return out

    result = {
        "unknown_fields": unknown_fields,
        "fields_set": sorted(fields_set),
        "empty_first": {
            "string": strings[:1] == [""],
            "function": len(d.function_table) > 0 and d.function_table[0].name_strindex == 0,
            "location": len(d.location_table) > 0 and len(d.location_table[0].lines) == 0,
            "mapping": len(d.mapping_table) > 0 and d.mapping_table[0].filename_strindex == 0,
            "stack": len(d.stack_table) > 0 and len(d.stack_table[0].location_indices) == 0,
            "attribute": len(d.attribute_table) > 0 and d.attribute_table[0].key_strindex == 0,
        },
        "mappings": [
            {"filename": string(m.filename_strindex), "attributes": attrs(m.attribute_indices)}
            for m in d.mapping_table
        ],
        "profiles": [],
    }
    for rp in req.resource_profiles:
        resource = {kv.key: any_value(kv.value) for kv in rp.resource.attributes}
        for sp in rp.scope_profiles:
            scope = {kv.key: any_value(kv.value) for kv in sp.scope.attributes}
            for p in sp.profiles:
                profile = {
                    "resource_attributes": resource,
                    "scope_attributes": scope,
                    "profile_attributes": attrs(p.attribute_indices),
                    "sample_type": [string(p.sample_type.type_strindex),
                                    string(p.sample_type.unit_strindex)],
                    "period_type": [string(p.period_type.type_strindex),
                                    string(p.period_type.unit_strindex)],
                    "period": p.period,
                    "time_unix_nano": p.time_unix_nano,
                    "duration_nano": p.duration_nano,
                    "samples": [],
                }
                for s in p.samples:
                    stack = []
                    if 0 <= s.stack_index < len(d.stack_table):
                        for li in d.stack_table[s.stack_index].location_indices:
                            stack.extend(frames(li))
                    profile["samples"].append({
                        "values": list(s.values),
                        "count": sum(s.values),
                        "attributes": attrs(s.attribute_indices),
                        "frames": stack,
                    })
                result["profiles"].append(profile)
    return result


def main():
    args = sys.argv[1:]
    lenient = "--lenient" in args
    files = [a for a in args if a != "--lenient"]
    requests = []
    for name in files:
        with open(name, "rb") as f:
            requests.append(facts(f.read()))
    json.dump({
        "package_version": importlib.metadata.version("opentelemetry-proto"),
        "sample_fields": {f.name: f.number for f in profiles_pb2.Sample.DESCRIPTOR.fields},
        "requests": requests,
    }, sys.stdout)
    bad = [(name, r["unknown_fields"]) for name, r in zip(files, requests) if r["unknown_fields"]]
    if bad and not lenient:
        for name, fields in bad:
            sys.stderr.write("%s: unknown fields: %s\n" % (name, "; ".join(fields[:10])))
        sys.exit(3)


if __name__ == "__main__":
    main()
