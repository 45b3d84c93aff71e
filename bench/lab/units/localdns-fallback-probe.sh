#!/bin/bash
# localdns-fallback-probe.sh: the fallback's probe, written for the lab after
# the description of AgentBaker PR 9486 (open), not copied. Run every 5 s by
# localdns-fallback-probe.timer: one query to 169.254.10.11; any answer counts
# as alive; 3 misses in a row start localdns-fallback.service.
set -uo pipefail

MISSES_FILE="/run/localdns-fallback-probe.misses"
MAX_MISSES=3

# While the fallback runs there is nothing to start: misses are not counted,
# so that those seen while it runs (the nat design DNATs this probe too)
# cannot start it again the moment localdns.service's ExecStartPre stopped
# it. (A choice of the lab's: the PR's description does not say.)
if systemctl is-active --quiet localdns-fallback.service; then
    echo 0 >"${MISSES_FILE}"
    exit 0
fi

if dig +short +timeout=1 +tries=1 health-check.localdns.local @169.254.10.11 >/dev/null 2>&1; then
    echo 0 >"${MISSES_FILE}"
    exit 0
fi
misses=$(( $(cat "${MISSES_FILE}" 2>/dev/null || echo 0) + 1 ))
echo "${misses}" >"${MISSES_FILE}"
echo "localdns-fallback-probe: 169.254.10.11 did not answer (${misses} in a row)."
if [ "${misses}" -ge "${MAX_MISSES}" ]; then
    echo 0 >"${MISSES_FILE}"
    echo "localdns-fallback-probe: ${MAX_MISSES} misses in a row; starting localdns-fallback.service."
    systemctl start --no-block localdns-fallback.service
fi
exit 0
