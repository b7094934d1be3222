"""``histstore demo``: a scripted agent conversation through ``with_history``, then shown;
then one compaction (``histstore.compact`` with a scripted summarizer) and its undo
(``store.revert``)."""

from __future__ import annotations

import argparse
import json
import sys
import uuid
from typing import Any

from histstore import Message, Store, admin, compact, with_history

from ._commands import open_store
from ._render import Style, message_lines
from ._show import show_conversation

__all__ = ["cmd_demo"]

_SYSTEM = "You are a concise weather assistant. Use get_weather for current conditions."
_WEATHER = {
    "Paris": {"city": "Paris", "temp_c": 14, "sky": "light rain", "wind_kmh": 18},
    "Tokyo": {"city": "Tokyo", "temp_c": 22, "sky": "clear", "wind_kmh": 7},
}
_SCRIPT = [
    "What's the weather in Paris right now?",
    "Should I take an umbrella?",
    "And how about Tokyo?",
    "Thanks!",
]


class _DemoModel:
    """A scripted stand-in for an LLM: deterministic, no network.

    It only knows what the history it is given says, like a real model: it calls the
    weather tool for a city it has no fresh result for, answers from a tool result, and
    answers a follow-up question from earlier turns.
    """

    def __init__(self) -> None:
        self.seen: list[int] = []

    async def __call__(self, messages: list[Message]) -> Message:
        self.seen.append(len(messages))
        last = messages[-1]
        if last.role == "tool":
            w = json.loads(last.content)
            return Message.assistant(
                f"It's {w['temp_c']} °C in {w['city']}, {w['sky']}, wind {w['wind_kmh']} km/h."
            )
        text = str(last.content).lower()
        for city in _WEATHER:
            if city.lower() in text:
                calls = sum(len(m.get("tool_calls") or []) for m in messages)
                call = {
                    "id": f"call_{calls + 1}",
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": json.dumps({"city": city})},
                }
                return Message.assistant(None, tool_calls=[call])
        if "umbrella" in text:
            results = [json.loads(m.content) for m in messages if m.role == "tool"]
            if results:
                w = results[-1]
                verdict = "Yes, take one" if "rain" in w["sky"] else "No need"
                return Message.assistant(
                    f"{verdict}: I checked {w['city']} a moment ago and it's {w['sky']}."
                )
        if "thank" in text:
            return Message.assistant("You're welcome. Stay dry!")
        return Message.assistant("I can only talk about the weather in Paris or Tokyo.")


async def _summarize(messages: list[Message]) -> str:
    """A scripted summarizer, no model: a fixed text that says how much it replaces."""
    return (
        f"(Summary of the {len(messages)} earlier messages: the user asked about the"
        " weather in Paris and was told to take an umbrella.)"
    )


async def _compact_and_undo(store: Store, view: Store, cid: str, style: Style) -> int | None:
    """Compact the older turns, show the result, revert it; the compacted revision."""
    out = sys.stdout
    before = await view.edit(cid)
    spliced = await compact(view, cid, _summarize, keep_turns=2)
    if spliced is None:  # the script always leaves something to compact
        return None
    after = await view.edit(cid)
    out.write(
        "\n"
        + style.bold("Compaction")
        + "\n"
        + style.dim(
            f"histstore.compact(store, c, summarize, keep_turns=2) replaced the"
            f" {len(spliced.removed)} messages of the older turns with one summary entry"
            f" by histstore:compact, as one change: revision {before.revision} ->"
            f" {after.revision}. The summarizer is a script too."
        )
        + "\n\n"
    )
    await show_conversation(store, cid, out)
    revision = await view.revert(cid, before.revision, by="demo:undo")
    back = await view.edit(cid)
    same = back.entries == before.entries
    ids = [e.entry_id for e in back.entries]
    verdict = (
        f"all {len(ids)} messages are back, entry ids {ids[0]}-{ids[-1]} included"
        if same and ids
        else "the messages differ from before (unexpected)"
    )
    out.write(
        "\n"
        + style.bold("Undo")
        + "\n"
        + f"store.revert(c, {before.revision}, by='demo:undo') -> revision {revision}:"
        + f" the compaction is undone, {verdict}.\n"
    )
    return after.revision


def _run_tool(call: dict[str, Any]) -> Message:
    args = json.loads(call["function"]["arguments"])
    return Message.tool(json.dumps(_WEATHER[args["city"]]), tool_call_id=call["id"])


async def cmd_demo(args: argparse.Namespace) -> int:
    where = admin.locate(args.url)
    out = sys.stdout
    style = Style(out)
    async with open_store(args.url, create=True, schema=args.schema) as store:
        user = "demo-user"
        cid = f"demo-{uuid.uuid4().hex[:8]}"
        view = store.scoped(user)
        model = _DemoModel()
        chat = with_history(view, model)
        kind = f"{where.display} (SQLite file)" if where.file is not None else where.display
        out.write(
            style.bold("histstore demo") + f": a scripted agent conversation, kept in {kind}\n"
        )
        out.write(
            style.dim(
                f"conversation {cid}, owned by {user}. The model is a local script; each call"
                " goes through with_history(), which replays the stored history and stores the"
                " reply."
            )
            + "\n\n"
        )
        await view.write(cid, [Message.system(_SYSTEM)])
        await view.merge_metadata(cid, {"title": "Weather questions", "source": "histstore demo"})
        for text in _SCRIPT:
            out.write(style.role("user", "you   ") + f" {text}\n")
            reply = await chat(cid, [Message.user(text)])
            while calls := reply[-1].get("tool_calls") or []:
                for line in message_lines(reply[-1].to_dict()):
                    note = style.dim(f"   (saw {model.seen[-1]} messages)")
                    out.write(style.role("assistant", "model ") + f" {line}{note}\n")
                results = [_run_tool(call) for call in calls]
                for r in results:
                    out.write(style.role("tool", "tool  ") + f" {r.content}\n")
                reply = await chat(cid, results)
            out.write(
                style.role("assistant", "model ")
                + f" {reply[-1].content}"
                + style.dim(f"   (saw {model.seen[-1]} messages)")
                + "\n\n"
            )
        out.write(style.bold("What the store now holds") + "\n\n")
        await show_conversation(store, cid, out)
        compacted = await _compact_and_undo(store, view, cid, style)
        total = len(await store.conversations())
    out.write("\n" + style.bold("Next") + "\n")
    url = "" if args.url is None else f" --url '{where.display}'"  # never a password
    steps = [
        (f"histstore ls{url}", f"{total} conversation(s) in this database"),
        (f"histstore show {cid}{url}", "this conversation again"),
        (f"histstore log {cid}{url}", "its change records: writes, the compaction, the undo"),
        (f"histstore export {cid}{url} > demo.jsonl", "as JSON Lines"),
        (f"histstore fork {cid} {cid}-b --upto 5{url}", "branch after the first answer"),
    ]
    if compacted is not None:
        back = (f"histstore revert {cid} {compacted}{url}", "back to the compacted history")
        steps.insert(3, back)
    width = max(len(cmd) for cmd, _note in steps)
    for cmd, note in steps:
        out.write(f"  {cmd:<{width}}  {style.dim('# ' + note)}\n")
    out.write(
        style.dim("In Python: async with histstore.connect() as store: ...  (see the README)")
        + "\n"
    )
    return 0
