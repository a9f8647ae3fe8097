"""Which shape of ``message['content']`` a chat template expects: a string or OpenAI parts.

vLLM calls this the template's content format and detects it from the template's syntax tree:
a template that loops over a message's ``content`` wants the OpenAI list of parts
(``"openai"``), any other reads it as text (``"string"``). mmserve also counts a ``content``
piped into ``selectattr`` / ``rejectattr`` / ``map`` (templates that count or join the parts
without a ``for`` loop, like the tiny presets') as ``"openai"``.
"""

from __future__ import annotations

from typing import Literal

import jinja2
from jinja2 import nodes
from transformers.utils.chat_template_utils import _compile_jinja_template

ContentFormat = Literal["string", "openai"]
_PART_FILTERS = ("selectattr", "rejectattr", "map")


def detect_content_format(template: str, default: ContentFormat = "string") -> ContentFormat:
    """``"openai"`` if the template iterates over (or filters) a message's content parts."""
    try:
        # transformers' environment knows its extensions ({% generation %}, loop controls)
        tree = _compile_jinja_template(template).environment.parse(template)
    except jinja2.TemplateError:
        return default
    names = _TemplateNames()
    for assign in tree.find_all(nodes.Assign):
        names.learn(assign.target, assign.node)
    for loop in tree.find_all(nodes.For):
        names.learn_loop(loop)
    for loop in tree.find_all(nodes.For):
        if names.reads_content(loop.iter):
            return "openai"
    for flt in tree.find_all(nodes.Filter):
        if flt.name in _PART_FILTERS and flt.node is not None and names.reads_content(flt.node):
            return "openai"
    return "string"


class _TemplateNames:
    """Variables that hold the message list, one message, or one message's content."""

    def __init__(self) -> None:
        self.message_lists = {"messages"}
        self.messages: set[str] = set()
        self.contents: set[str] = set()

    def learn(self, target: nodes.Node, value: nodes.Node) -> None:
        if not isinstance(target, nodes.Name):
            return
        if _is_name(_unwrap(value), self.message_lists):
            self.message_lists.add(target.name)
        elif self.reads_content(value):
            self.contents.add(target.name)

    def learn_loop(self, loop: nodes.For) -> None:
        if isinstance(loop.target, nodes.Name) and _is_name(_unwrap(loop.iter), self.message_lists):
            self.messages.add(loop.target.name)
        for assign in loop.find_all(nodes.Assign):  # aliases set inside the loop body
            self.learn(assign.target, assign.node)

    def reads_content(self, node: nodes.Node) -> bool:
        node = _unwrap(node)
        if _is_name(node, self.contents):
            return True
        if isinstance(node, nodes.Getitem) and isinstance(node.arg, nodes.Const):
            return node.arg.value == "content" and self._is_message(node.node)
        if isinstance(node, nodes.Getattr):
            return node.attr == "content" and self._is_message(node.node)
        return False

    def _is_message(self, node: nodes.Node) -> bool:
        if _is_name(node, self.messages):
            return True
        # messages[-1]['content'], messages[0].content
        return isinstance(node, nodes.Getitem) and _is_name(_unwrap(node.node), self.message_lists)


def _unwrap(node: nodes.Node) -> nodes.Node:
    """``x | f | g``, ``x is t`` and ``x[a:b]`` all read ``x``."""
    while True:
        if isinstance(node, (nodes.Filter, nodes.Test)) and node.node is not None:
            node = node.node
        elif isinstance(node, nodes.Getitem) and isinstance(node.arg, nodes.Slice):
            node = node.node
        else:
            return node


def _is_name(node: nodes.Node, names: set[str]) -> bool:
    return isinstance(node, nodes.Name) and node.name in names
