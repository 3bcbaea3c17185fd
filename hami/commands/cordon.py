"""``hami cordon|uncordon NODE CARD...`` and ``hami cordon NODE --list``: per-card cordon
(docs/protocol.md, "Fit" check 2).

Owns the command: read the Node, resolve each CARD (a uuid, or ``#INDEX``) against the cards the node
registered (``hami.io/node-nvidia-register``), refuse unknown ones with the node's card list, and change
``hami.io/device-cordon`` through :func:`hami.kube.cordon.update_device_cordon` (a compare-and-set that
keeps other writers' entries). The scheduler then gives cordoned cards no new pods (``CardCordoned``);
pods already on them keep counting. Uncordon also accepts a listed uuid the node no longer registers, so
stale entries can be cleaned up. Exit code 0 on success (changed or already so), 2 on errors. Imports
``hami.kube`` and the codec; must not import the Kubernetes client.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from collections.abc import Mapping, Sequence
from typing import Any, TextIO

from hami import objects
from hami.annotations import NODE_REGISTER, AnnotationError, decode_node_devices
from hami.core.model import Device
from hami.kube import nodes as kube_nodes
from hami.kube.client import KubeError, NotFound, load_api_client
from hami.kube.cordon import cordon_of, update_device_cordon
from hami.kube.protocol import KubeApi


class CordonError(Exception):
    """A request the command refuses (unknown node or card); printed as is, exit code 2."""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("node", metavar="NODE", help="the node whose cards to change")
    parser.add_argument(
        "cards", metavar="CARD", nargs="*", help="card uuids (GPU-...) or NVML indexes written #INDEX"
    )
    parser.add_argument(
        "--list",
        action="store_true",
        help="show the node's cards (index, uuid, model) and which are cordoned",
    )
    parser.add_argument(
        "--kubeconfig", default=None, help="kubeconfig file (default: in-cluster, then ~/.kube/config)"
    )


def run(args: argparse.Namespace) -> int:
    command = str(args.command)
    if not args.cards and not args.list:
        print(f"hami {command}: name at least one card (uuid or #INDEX), or use --list", file=sys.stderr)
        return 2
    try:
        api = load_api_client(args.kubeconfig, component=f"hami-{command}")
        try:
            return asyncio.run(
                cordon_command(
                    api, args.node, args.cards, cordon=command == "cordon", show=args.list, out=sys.stdout
                )
            )
        finally:
            api.close()
    except (KubeError, CordonError) as exc:
        print(f"hami {command}: {exc}", file=sys.stderr)
        return 2


async def cordon_command(
    api: KubeApi, node: str, cards: Sequence[str], *, cordon: bool, show: bool, out: TextIO
) -> int:
    """Apply the change (if any cards are named), print it, then the card list when ``show``; 0 on success.

    Raises :class:`CordonError` for an unknown node or card (nothing is written then).
    """
    try:
        obj = await kube_nodes.get_node(api, node)
    except NotFound:
        raise CordonError(f"node {node} not found") from None
    registered, problem = registered_cards(obj)
    if cards:
        uuids = resolve_cards(node, cards, registered, problem, cordon_of(obj), cordon=cordon)
        update = await update_device_cordon(
            api, node, add=uuids if cordon else (), remove=() if cordon else uuids, node=obj
        )
        verb = "cordoned" if cordon else "uncordoned"
        for uuid in uuids:
            was = uuid in update.before
            if was == cordon:
                print(f"{describe(uuid, registered)} on node {node} is already {verb}", file=out)
            else:
                print(f"{verb} {describe(uuid, registered)} on node {node}", file=out)
        if not update.written:
            print("nothing written", file=out)
        removed = " (annotation removed)" if update.written else ""
        listed = ", ".join(sorted(update.after)) or f"none{removed}"
        print(f"node {node} cordoned cards: {listed}", file=out)
        cordoned = update.after
    else:
        cordoned = cordon_of(obj)
    if show:
        print_cards(node, registered, problem, cordoned, out)
    return 0


def registered_cards(node: Mapping[str, Any]) -> tuple[tuple[Device, ...], str | None]:
    """The node's registered cards, or none and why (no or unreadable registration)."""
    text = objects.annotations(node).get(NODE_REGISTER)
    if text is None:
        return (), f"it has no {NODE_REGISTER} annotation (no device plugin registered it)"
    try:
        return decode_node_devices(text), None
    except AnnotationError as exc:
        return (), f"its registration is unreadable: {exc}"


def resolve_cards(
    node: str,
    tokens: Sequence[str],
    registered: Sequence[Device],
    problem: str | None,
    cordoned: frozenset[str],
    *,
    cordon: bool,
) -> list[str]:
    """The uuids the arguments name, in order, without repeats; :class:`CordonError` lists unknown ones."""
    by_uuid = {card.uuid for card in registered}
    indexes: dict[int, list[str]] = {}
    for card in registered:
        indexes.setdefault(card.index, []).append(card.uuid)
    uuids: list[str] = []
    unknown: list[str] = []
    for token in tokens:
        text = token.strip()
        uuid: str | None = None
        if text.startswith("#") and text[1:].isdigit():
            matches = indexes.get(int(text[1:]), [])
            uuid = matches[0] if len(matches) == 1 else None
        elif text in by_uuid or (not cordon and text in cordoned):
            uuid = text  # uncordon may drop a listed card the node no longer registers
        if uuid is None:
            unknown.append(token)
        elif uuid not in uuids:
            uuids.append(uuid)
    if unknown:
        names = ", ".join(repr(token) for token in unknown)
        if problem is not None:
            raise CordonError(f"node {node} has no card {names}: {problem}")
        cards = "; ".join(f"#{c.index} {c.uuid} {c.type or '-'}" for c in registered)
        raise CordonError(f"node {node} has no card {names}; its cards: {cards}")
    return uuids


def describe(uuid: str, registered: Sequence[Device]) -> str:
    card = next((c for c in registered if c.uuid == uuid), None)
    return uuid if card is None else f"{uuid} (#{card.index} {card.type or '-'})"


def print_cards(
    node: str, registered: Sequence[Device], problem: str | None, cordoned: frozenset[str], out: TextIO
) -> None:
    print(f"node {node}: {len(registered)} cards, {len(cordoned)} cordoned", file=out)
    if problem is not None:
        print(f"  {problem}", file=out)
    rows = [
        (f"#{c.index}", c.uuid, c.type or "-", "cordoned" if c.uuid in cordoned else "") for c in registered
    ]
    known = {c.uuid for c in registered}
    rows += [("?", uuid, "(not registered on this node)", "cordoned") for uuid in sorted(cordoned - known)]
    widths = [max((len(row[i]) for row in rows), default=0) for i in range(3)]
    for row in rows:
        cells = [row[i].ljust(widths[i]) for i in range(3)]
        print(f"  {'  '.join(cells)}  {row[3]}".rstrip(), file=out)
