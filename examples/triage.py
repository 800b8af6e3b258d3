"""A support-triage agent that fans out to sub-agents.

The triage agent classifies a ticket, then starts two sub-agents in parallel - one looks
up the customer's account and history, one drafts a reply - and merges their work. Each
sub-agent is its own task with its own KV session, but it inherits the parent's tenant,
priority and remaining deadline budget, and its spend rolls up into the parent's.

    taskplane run examples.triage:triage_agent --arg "I was charged twice and cannot log in"
"""

from __future__ import annotations

import asyncio
from datetime import timedelta

from pydantic import BaseModel

from examples.common import DEFAULT_MODEL
from taskplane import agent, llm, step

CATEGORIES = ("billing", "login", "bug", "other")

#: The CRM the lookup tool reads (offline).
ACCOUNTS: dict[str, dict[str, str]] = {
    "ada@example.com": {"plan": "enterprise", "since": "2021", "open_tickets": "1"},
    "bob@example.com": {"plan": "free", "since": "2024", "open_tickets": "0"},
}


class Triage(BaseModel):
    ticket: str
    category: str
    account: str
    reply: str


def classify(text: str, ticket: str) -> str:
    """The category the model named, else a keyword guess from the ticket."""
    said = text.lower()
    for c in CATEGORIES:
        if c in said:
            return c
    lowered = ticket.lower()
    if any(w in lowered for w in ("charge", "invoice", "refund", "billing")):
        return "billing"
    if any(w in lowered for w in ("log in", "login", "password")):
        return "login"
    return "other"


@step(retries=2, timeout=timedelta(seconds=10))
async def lookup_account(customer: str) -> dict[str, str]:
    """Read the customer's account from the CRM (a stand-in for an HTTP API)."""
    await asyncio.sleep(0.05)
    return ACCOUNTS.get(customer, {"plan": "unknown", "since": "?", "open_tickets": "0"})


@agent(name="triage-account", steps=1)
async def account_agent(customer: str, model: str = DEFAULT_MODEL) -> str:
    """Sub-agent: summarise the customer's account for the support engineer."""
    account = await lookup_account(customer)
    note = await llm.chat(
        model=model, max_tokens=32, temperature=0,
        messages=[{"role": "user", "content": f"Summarise this account in one line: {account}"}],
    )
    return f"{account['plan']} customer since {account['since']}: {note.text}"


@agent(name="triage-reply", steps=2)
async def reply_agent(ticket: str, category: str, model: str = DEFAULT_MODEL) -> str:
    """Sub-agent: draft and tighten a reply to the customer."""
    messages = [
        {"role": "system", "content": "You write short, kind support replies."},
        {"role": "user", "content": f"Draft a reply to this {category} ticket: {ticket}"},
    ]
    draft = await llm.chat(model=model, messages=messages, max_tokens=64, temperature=0)
    messages += [draft.message, {"role": "user", "content": "Make it two sentences."}]
    final = await llm.chat(model=model, messages=messages, max_tokens=48, temperature=0)
    return final.text


@agent(name="triage", tenant="acme", priority="interactive", deadline=timedelta(minutes=2), steps=2)
async def triage_agent(ticket: str, customer: str = "ada@example.com", model: str = DEFAULT_MODEL) -> Triage:
    """Classify ``ticket``, look up the account and draft a reply in parallel sub-agents."""
    label = await llm.chat(
        model=model, max_tokens=8, temperature=0,
        messages=[{"role": "user", "content": f"Classify as one of {', '.join(CATEGORIES)}: {ticket}"}],
    )
    category = classify(label.text, ticket)
    account, reply = await asyncio.gather(account_agent(customer, model), reply_agent(ticket, category, model))
    check = await llm.chat(
        model=model, max_tokens=16, temperature=0,
        messages=[{"role": "user", "content": f"Does this reply fit a {category} ticket? {reply}"}],
    )
    return Triage(ticket=ticket, category=category, account=account, reply=f"{reply} ({check.text[:20]})")
