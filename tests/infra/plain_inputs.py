"""What the engine does with a remote component's inputs, checked where the mocks can see it.

The Python SDK sends a remote (multi-language) component's inputs with every Output kept as an
output value (pulumi/runtime/resource.py: `keep_output_values=remote`) when the monitor supports
"outputValues", as the real engine does; the component's Node side then wraps each of them in an
Output (sdk/nodejs/provider/server.ts, deserializeInputs). An input the schema marks plain is used
as a plain value there (pulumi-eks authenticationMode.ts runs Object.entries() over
`accessEntries`), so an Output in it breaks the deployment while the mocks' resolved values look
fine. Which inputs are plain comes from the installed SDK: its generated `_internal_init` types a
plain parameter without `pulumi.Input[...]`, i.e. its annotation admits no Output."""

from __future__ import annotations

import functools
import importlib
import inspect
import typing
from collections import abc
from typing import Any

import pulumi
from google.protobuf import struct_pb2
from pulumi import _types
from pulumi.runtime import rpc

OUTPUT_VALUE = rpc._special_output_value_sig  # noqa: SLF001 - the wire format under test
SIG = rpc._special_sig_key  # noqa: SLF001
SECRET = rpc._special_secret_sig  # noqa: SLF001


class PlainInputError(ValueError):
    """An Output reached an input that the component reads as a plain value."""


def _members(annotation: Any) -> tuple[Any, ...]:
    return typing.get_args(annotation) if typing.get_origin(annotation) is typing.Union \
        else (annotation,)


def accepts_output(annotation: Any) -> bool:
    """`pulumi.Input[T]` is Union[T, Awaitable[T], 'Output[T]']: an Output member (a forward
    reference in the generated code) marks an input that may be an Output."""
    for member in _members(annotation):
        if isinstance(member, typing.ForwardRef) and member.__forward_arg__.startswith("Output"):
            return True
        if member is pulumi.Output or typing.get_origin(member) is pulumi.Output:
            return True
    return False


@functools.cache
def _component(token: str) -> tuple[type, Any]:
    """The SDK class of a resource token and its module, as the code generator names them:
    `eks:index:Cluster` -> pulumi_eks.Cluster, `kubernetes:yaml/v2:ConfigFile` ->
    pulumi_kubernetes.yaml.v2.ConfigFile."""
    package, path, name = token.split(":")
    module = f"pulumi_{package.replace('-', '_')}"
    if path != "index":
        module += "." + path.replace("/", ".").replace("-", "_")
    module = importlib.import_module(module)
    return getattr(module, name), module


def _fields(cls: type, init: Any) -> dict[str, Any]:
    """Wire name -> annotation of an args class's parameters (those of `init`)."""
    names = _types.input_type_py_to_pulumi_names(cls)
    return {names[p]: param.annotation for p, param in inspect.signature(init).parameters.items()
            if p in names}


@functools.cache
def component_inputs(token: str) -> dict[str, Any]:
    """Wire name -> annotation of every input of a component, from `_internal_init`."""
    cls, module = _component(token)
    return _fields(getattr(module, f"{cls.__name__}Args"), cls._internal_init)  # noqa: SLF001


def plain_inputs(token: str) -> set[str]:
    return {name for name, annotation in component_inputs(token).items()
            if not accepts_output(annotation)}


def _is_output_value(value: Any) -> bool:
    return isinstance(value, dict) and value.get(SIG) == OUTPUT_VALUE


def _input_types(annotation: Any, module: Any) -> list[type]:
    """Args classes among the members of an annotation (forward references resolved in the
    component's package, where the generated code names them)."""
    found = []
    for member in _members(annotation):
        if isinstance(member, typing.ForwardRef):
            member = getattr(module, member.__forward_arg__, None)
        if isinstance(member, type) and _types.is_input_type(member):
            found.append(member)
    return found


def outputs_in_plain_places(annotation: Any, value: Any, path: str, module: Any) -> list[str]:
    """Paths where an output value sits at a place its annotation types plain, descending
    through plain mappings, sequences and args classes (an Input member stops the descent:
    the component accepts an Output there)."""
    if accepts_output(annotation):
        return []
    if _is_output_value(value):
        return [path]
    found = []
    for member in _members(annotation):
        origin, args = typing.get_origin(member), typing.get_args(member)
        if origin is abc.Mapping and isinstance(value, dict) and len(args) == 2:
            for key, item in value.items():
                found += outputs_in_plain_places(args[1], item, f"{path}.{key}", module)
            return found
        if origin is abc.Sequence and isinstance(value, list) and args:
            for i, item in enumerate(value):
                found += outputs_in_plain_places(args[0], item, f"{path}[{i}]", module)
            return found
    for cls in _input_types(annotation, module) if isinstance(value, dict) else []:
        for key, field in _fields(cls, cls.__init__).items():
            if key in value:
                found += outputs_in_plain_places(field, value[key], f"{path}.{key}", module)
        return found
    return found


def check(token: str, name: str, inputs: dict[str, Any]) -> None:
    """Raise PlainInputError naming every plain input of the component that holds an Output."""
    _, module = _component(token)
    declared = component_inputs(token)
    bad = [p for key, value in inputs.items() if key in declared
           for p in outputs_in_plain_places(declared[key], value, key, module)]
    if bad:
        raise PlainInputError(
            f"{token} {name}: {', '.join(bad)} got an Output, but the component reads "
            f"{'it' if len(bad) == 1 else 'them'} as a plain value (the SDK types the input "
            "without pulumi.Input); pass a plain value decided before the component")


def resolve_output_values(value: struct_pb2.Value) -> None:
    """Replace, in place, every output value with what the engine would resolve it to: its
    value (a secret stays a secret), or the unknown sentinel while it has none."""
    kind = value.WhichOneof("kind")
    if kind == "list_value":
        for item in value.list_value.values:
            resolve_output_values(item)
    elif kind == "struct_value":
        fields = value.struct_value.fields
        if SIG in fields and fields[SIG].string_value == OUTPUT_VALUE:
            inner = struct_pb2.Value()
            if "value" in fields:
                inner.CopyFrom(fields["value"])
                resolve_output_values(inner)
            else:
                inner.string_value = rpc.UNKNOWN
            if "secret" in fields and fields["secret"].bool_value:
                secret = struct_pb2.Value()
                secret.struct_value.fields[SIG].string_value = SECRET
                secret.struct_value.fields["value"].CopyFrom(inner)
                inner = secret
            value.CopyFrom(inner)
        else:
            for item in fields.values():
                resolve_output_values(item)
