#!/usr/bin/python3
"""Renders the chat-template test matrix with the reference engine.

Every template in tests/chat/templates/ is rendered over every context in
tests/chat/contexts.json by Debian's python3-jinja2, configured the way
Hugging Face transformers configures it for apply_chat_template
(transformers/utils/chat_template_utils.py): an ImmutableSandboxedEnvironment
with trim_blocks and lstrip_blocks, the loop-controls extension and a
`generation` block tag, a tojson filter that is json.dumps (no HTML
escaping), and the raise_exception and strftime_now globals. Each render is
called with messages, tools, documents, add_generation_prompt and the rest
of the context as keyword arguments, as render_jinja_template does.

    render_reference.py OUT.json

writes a list of {template, context, output | error, raised} records that
tests/model/jinja_reference_test.cc renders again with linattn's engine.
"""
import json
import os
import sys
from datetime import datetime

import jinja2
import jinja2.ext
from jinja2.exceptions import TemplateError
from jinja2.sandbox import ImmutableSandboxedEnvironment

HERE = os.path.dirname(os.path.abspath(__file__))


class GenerationBlock(jinja2.ext.Extension):
    """{% generation %}…{% endgeneration %}: renders its body as is."""
    tags = {"generation"}

    def parse(self, parser):
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(["name:endgeneration"], drop_needle=True)
        return jinja2.nodes.CallBlock(self.call_method("_body"), [], [], body).set_lineno(lineno)

    def _body(self, caller):
        return caller()


class Raised(Exception):
    pass


def raise_exception(message):
    raise TemplateError(message)


def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators,
                      sort_keys=sort_keys)


def environment():
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=[GenerationBlock, jinja2.ext.loopcontrols])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
    return env


def main():
    out_path = sys.argv[1]
    env = environment()
    with open(os.path.join(HERE, "contexts.json"), encoding="utf-8") as f:
        contexts = json.load(f)
    records = []
    template_dir = os.path.join(HERE, "templates")
    for name in sorted(os.listdir(template_dir)):
        if not name.endswith(".jinja"):
            continue
        with open(os.path.join(template_dir, name), encoding="utf-8") as f:
            source = f.read()
        template = env.from_string(source)
        for context in contexts:
            kwargs = dict(context["values"])
            messages = kwargs.pop("messages")
            record = {"template": name, "context": context["name"]}
            try:
                record["output"] = template.render(
                    messages=messages, tools=kwargs.pop("tools", None),
                    documents=kwargs.pop("documents", None),
                    add_generation_prompt=kwargs.pop("add_generation_prompt", False), **kwargs)
            except TemplateError as e:
                # raise_exception's TemplateError carries the template's own
                # message; other TemplateErrors (undefined values) are errors
                # of the renderer.
                record["error"] = str(e)
                record["raised"] = type(e) is TemplateError
            except Exception as e:  # a Python error inside the template
                record["error"] = f"{type(e).__name__}: {e}"
                record["raised"] = False
            records.append(record)
    with open(out_path, "w", encoding="utf-8") as f:
        json.dump(records, f, ensure_ascii=False, indent=1)


if __name__ == "__main__":
    main()
