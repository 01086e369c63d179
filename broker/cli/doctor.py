"""``acp-broker doctor``: how this host would run its agents, sealed or not, and why."""

from __future__ import annotations

from ..config import Settings


async def report(settings: Settings) -> tuple[list[str], bool]:
    """Lines that say how each configured agent would run on this host, and whether every
    agent that must run sealed can."""
    from workers.agent_host.sandbox import SandboxRefused, Sealer, sandbox_policy

    sealer = Sealer(sandbox_policy(settings))
    sealing = await sealer.sealing()
    lines = [
        f"sandbox setting: {settings.sandbox}",
        sealing.describe(),
        f"private /tmp of a sealed agent: {settings.sandbox_tmp_bytes} bytes",
        f"hidden from sealed agents: {', '.join(settings.hidden_paths()) or 'nothing configured'}",
    ]
    healthy = True
    for spec in settings.agent_list():
        try:
            plan = await sealer.plan(spec)
        except SandboxRefused as exc:
            lines.append(f"agent {spec.name}: REFUSED: {exc}")
            healthy = False
            continue
        if plan is None:
            lines.append(f"agent {spec.name}: UNSEALED (it reads what the host's user can)")
            continue
        network = "network on" if spec.network else "no network"
        lines.append(
            f"agent {spec.name}: sealed, {network}, a process per {spec.process_per}, "
            f"read-only extra: {', '.join(spec.ro_paths) or 'none'}, "
            f"writable extra: {', '.join(spec.rw_paths) or 'none'}"
        )
    return lines, healthy
