#!/bin/bash
# Stand-in for AKS LocalDNS's supervisor, /opt/azure/containers/localdns/localdns.sh
# (Azure/AgentBaker parts/linux/cloud-init/artifacts/localdns.sh, read at
# commit 06836ee2301e, 2026-08-21). It keeps what decides how LocalDNS goes
# down and comes back, in the same order and with the same timings:
#   - delete any link named localdns, recreate it, add 169.254.10.10/32 and
#     169.254.10.11/32, set it up;
#   - start CoreDNS in the background with -pidfile /run/localdns.pid (through
#     systemd-cat when under systemd), wait for the pidfile (0.1 s polls, 10 s),
#     then for http://169.254.10.10:8181/ready to say OK (0.1 s polls, 60 s);
#   - systemd-notify --ready;
#   - a watchdog loop every WATCHDOG_USEC/5 (12 s with WatchdogSec=60): the
#     ready endpoint and `dig health-check.localdns.local` at .10 and at .11;
#     WATCHDOG=1 only when all three pass; WATCHDOG=trigger and exit after 10
#     failures in 600 s;
#   - the same traps: ABRT ERR INT PIPE run the cleanup and exit 216, EXIT runs
#     the cleanup. SIGTERM is not trapped, so `systemctl stop` (SIGTERM to this
#     script) kills bash outright, without its cleanup, as on a node;
#   - the iptables raw-table NOTRACK rules for .10/.11 udp+tcp dport 53 in
#     OUTPUT and PREROUTING (comment "localdns: skip conntrack"): removed
#     first thing at start, added right after the link, removed first thing
#     in the cleanup;
#   - the networkd drop-in 70-localdns.conf: removed at start, written once
#     CoreDNS is ready (before READY=1), removed in the cleanup right after
#     the NOTRACK rules;
#   - the cleanup: NOTRACK rules, drop-in, then, if CoreDNS runs, sleep 5 s,
#     SIGINT it and wait, then delete the localdns link (taking .10 and .11
#     off the node).
# `localdns.sh cleanup` runs the cleanup alone: ExecStopPost of the units from
# AgentBaker PR 9360 on (PR 9439 is stacked on it). With no COREDNS_PID of its
# own it finds CoreDNS through the pidfile.
#
# Left out, because the lab node has no use for them:
#   - `networkctl reload` after writing or removing the drop-in, and the wait
#     at start for resolv.conf to drop 169.254.10.10 (the guest runs no
#     systemd-networkd; the node's resolv.conf is the lab's, pointing at
#     .10 throughout): the file is written and removed at the same points;
#   - Corefile regeneration from base64, VNet DNS server substitution, metrics
#     .prom files, the hosts-plugin node annotation.
# Differences: the link kind comes from LINK_KIND (default bridge: this
# project's machines lack the dummy driver; nodes use dummy), and the CoreDNS
# binary and Corefile paths from the environment (EnvironmentFile
# /etc/localdns/environment, as the AKS unit reads it); the drop-in's
# directory is NETWORK_DROPIN_DIR (a node's is named after the network file
# of its default-route interface). The rules are set with the guest's
# iptables, so in the node's network namespace only.
set -euo pipefail

ERR_LOCALDNS_FAIL=216             # as localdns.sh (cse_helpers.sh)
ERR_LOCALDNS_COREFILE_NOTFOUND=217
ERR_LOCALDNS_BINARY_ERR=219

LOCALDNS_SCRIPT_PATH="/opt/azure/containers/localdns"
UPDATED_LOCALDNS_CORE_FILE="${UPDATED_LOCALDNS_CORE_FILE:-${LOCALDNS_SCRIPT_PATH}/updated.localdns.corefile}"
COREDNS_BINARY_PATH="${COREDNS_BINARY_PATH:-${LOCALDNS_SCRIPT_PATH}/binary/coredns}"
LINK_KIND="${LINK_KIND:-bridge}"
LOCALDNS_NODE_LISTENER_IP="169.254.10.10"
LOCALDNS_CLUSTER_LISTENER_IP="169.254.10.11"
LOCALDNS_SHUTDOWN_DELAY="${LOCALDNS_SHUTDOWN_DELAY:-5}"
LOCALDNS_PID_FILE="/run/localdns.pid"
CURL_COMMAND=(curl -s --noproxy "${LOCALDNS_NODE_LISTENER_IP}" --connect-timeout 5 --max-time 10 "http://${LOCALDNS_NODE_LISTENER_IP}:8181/ready")
START_LOCALDNS_TIMEOUT=10
LOCALDNS_PID_POLL_INTERVAL_SECONDS=0.1
LOCALDNS_READY_POLL_INTERVAL_SECONDS=0.1
LOCALDNS_READY_TIMEOUT_SECONDS=60
DNS_HEALTH_CHECK_TIMEOUT=2
DNS_HEALTH_CHECK_TRIES=2
NETWORK_DROPIN_DIR="${NETWORK_DROPIN_DIR:-/run/systemd/network/10-eth0.network.d}"
NETWORK_DROPIN_FILE="${NETWORK_DROPIN_DIR}/70-localdns.conf"
IPTABLES_COMMENT="localdns: skip conntrack"
IPTABLES_RULES=()
for CHAIN in OUTPUT PREROUTING; do
    for IP in ${LOCALDNS_NODE_LISTENER_IP} ${LOCALDNS_CLUSTER_LISTENER_IP}; do
        for PROTO in tcp udp; do
            IPTABLES_RULES+=("${CHAIN} -p ${PROTO} -d ${IP} --dport 53 -j NOTRACK")
        done
    done
done

# cleanup_iptables_and_dns removes the NOTRACK rules (found by their comment)
# and the drop-in, as AKS's function of that name does (less networkctl).
cleanup_iptables_and_dns() {
    local chain rule_num failed=false
    echo "Cleaning up any existing localdns iptables rules..."
    for chain in OUTPUT PREROUTING; do
        for rule_num in $(iptables -w -t raw -L "${chain}" --line-numbers -n | grep "${IPTABLES_COMMENT}" | awk '{print $1}' | sort -nr); do
            iptables -w -t raw -D "${chain}" "${rule_num}" || failed=true
        done
    done
    [ "${failed}" = false ] || return 1
    echo "Removing network drop-in file ${NETWORK_DROPIN_FILE}."
    rm -f "${NETWORK_DROPIN_FILE}" || return 1
    return 0
}

# coredns_pid_from_file prints the PID in the pidfile if it is a live coredns.
coredns_pid_from_file() {
    local pid
    pid=$(cat "${LOCALDNS_PID_FILE}" 2>/dev/null) || return 1
    [ -n "${pid}" ] && [ "$(cat "/proc/${pid}/comm" 2>/dev/null)" = "coredns" ] || return 1
    echo "${pid}"
}

cleanup_localdns_configs() {
    # Disable error handling so that we don't get into a recursive loop.
    set +e
    cleanup_iptables_and_dns || return 1
    local own=true
    if [ -z "${COREDNS_PID:-}" ]; then
        own=false
        COREDNS_PID=$(coredns_pid_from_file)
    fi
    if [ -n "${COREDNS_PID:-}" ] && ps -p "${COREDNS_PID}" >/dev/null 2>&1; then
        if [ "${LOCALDNS_SHUTDOWN_DELAY}" -gt 0 ]; then
            echo "Sleeping ${LOCALDNS_SHUTDOWN_DELAY} seconds to allow connections to terminate."
            sleep "${LOCALDNS_SHUTDOWN_DELAY}"
        fi
        echo "Sending SIGINT to localdns and waiting for it to terminate."
        kill -SIGINT "${COREDNS_PID}" || return 1
        if [ "${own}" = true ]; then
            wait "${COREDNS_PID}"
        else
            # Not our child: poll (at most 10 s) until it is gone.
            for _ in $(seq 100); do ps -p "${COREDNS_PID}" >/dev/null 2>&1 || break; sleep 0.1; done
        fi
    fi
    if ip link show dev localdns >/dev/null 2>&1; then
        echo "Removing localdns ${LINK_KIND} interface."
        ip link del name localdns || return 1
    fi
    echo "Successfully cleanup localdns related configurations."
    return 0
}

if [ "${1:-}" = "cleanup" ]; then
    cleanup_localdns_configs || echo "Cleanup failed with error code: ${ERR_LOCALDNS_FAIL}."
    exit 0
fi

if [ ! -s "${UPDATED_LOCALDNS_CORE_FILE}" ]; then
    echo "Localdns corefile either does not exist or is empty at ${UPDATED_LOCALDNS_CORE_FILE}."
    exit ${ERR_LOCALDNS_COREFILE_NOTFOUND}
fi
if [ ! -x "${COREDNS_BINARY_PATH}" ]; then
    echo "Coredns binary either doesn't exist or isn't executable at ${COREDNS_BINARY_PATH}."
    exit ${ERR_LOCALDNS_BINARY_ERR}
fi

cleanup_iptables_and_dns || exit ${ERR_LOCALDNS_FAIL}

trap 'echo "Error occurred. Cleaning up..."; cleanup_localdns_configs; exit $ERR_LOCALDNS_FAIL' ABRT ERR INT PIPE
trap 'echo "Executing cleanup function."; cleanup_localdns_configs || echo "Cleanup failed with error code: $ERR_LOCALDNS_FAIL."' EXIT

echo "Setting up localdns ${LINK_KIND} interface with IPs ${LOCALDNS_NODE_LISTENER_IP} and ${LOCALDNS_CLUSTER_LISTENER_IP}."
if ip link show localdns >/dev/null 2>&1; then
    echo "Interface localdns already exists, deleting it."
    ip link delete localdns
fi
ip link add name localdns type "${LINK_KIND}"
ip link set up dev localdns
ip addr add ${LOCALDNS_NODE_LISTENER_IP}/32 dev localdns
ip addr add ${LOCALDNS_CLUSTER_LISTENER_IP}/32 dev localdns
echo "Adding iptables rules to skip conntrack for queries to localdns."
for RULE in "${IPTABLES_RULES[@]}"; do
    # shellcheck disable=SC2086 # RULE is words, as AKS evals them
    iptables -w -t raw -m comment --comment "${IPTABLES_COMMENT}" -A ${RULE}
done

COREDNS_COMMAND="${COREDNS_BINARY_PATH} -conf ${UPDATED_LOCALDNS_CORE_FILE} -pidfile ${LOCALDNS_PID_FILE}"
if [ -n "${SYSTEMD_EXEC_PID:-}" ]; then
    COREDNS_COMMAND="systemd-cat --identifier=localdns-coredns --stderr-priority=3 -- ${COREDNS_COMMAND}"
fi
echo "Starting localdns: ${COREDNS_COMMAND}."
rm -f "${LOCALDNS_PID_FILE}"
${COREDNS_COMMAND} &
attempts=0
max_attempts=$((START_LOCALDNS_TIMEOUT * 10))
while [ ! -f "${LOCALDNS_PID_FILE}" ]; do
    if [ "${attempts}" -ge "${max_attempts}" ]; then
        echo "Timed out waiting for CoreDNS to create PID file at ${LOCALDNS_PID_FILE}."
        exit ${ERR_LOCALDNS_FAIL}
    fi
    sleep "${LOCALDNS_PID_POLL_INTERVAL_SECONDS}"
    attempts=$((attempts + 1))
done
COREDNS_PID="$(cat ${LOCALDNS_PID_FILE})"
echo "Localdns PID is ${COREDNS_PID}."

echo "Waiting for localdns to start and be able to serve traffic."
attempts=0
max_attempts=$((LOCALDNS_READY_TIMEOUT_SECONDS * 10))
until [ "$("${CURL_COMMAND[@]}")" = "OK" ]; do
    if [ "${attempts}" -ge "${max_attempts}" ]; then
        echo "Localdns failed to come online after ${LOCALDNS_READY_TIMEOUT_SECONDS} seconds (timeout)."
        exit ${ERR_LOCALDNS_FAIL}
    fi
    sleep "${LOCALDNS_READY_POLL_INTERVAL_SECONDS}"
    attempts=$((attempts + 1))
done
echo "Localdns is online and ready to serve traffic."
echo "Updating network DNS configuration to point to localdns via ${NETWORK_DROPIN_FILE}."
mkdir -p "${NETWORK_DROPIN_DIR}"
printf '# Set DNS server to localdns cluster listernerIP.\n[Network]\nDNS=%s\n\n# Disable DNS provided by DHCP to ensure local DNS is used.\n[DHCP]\nUseDNS=false\n' "${LOCALDNS_NODE_LISTENER_IP}" >"${NETWORK_DROPIN_FILE}"
chmod -R ugo+rX "${NETWORK_DROPIN_DIR}"
echo "Startup complete - serving node and pod DNS traffic."

if [ -n "${NOTIFY_SOCKET:-}" ]; then
    systemd-notify --ready
fi

if [ -n "${NOTIFY_SOCKET:-}" ] && [ -n "${WATCHDOG_USEC:-}" ]; then
    HEALTH_CHECK_INTERVAL=$((${WATCHDOG_USEC:-5000000} * 20 / 100 / 1000000))
    echo "Starting watchdog loop at ${HEALTH_CHECK_INTERVAL} second intervals."
    max_sliding_window_failures=10
    sliding_window_duration_in_seconds=600
    sliding_window_failure_count=0
    sliding_window_start_time=0
    while true; do
        health_check_passed=true
        if [ "$("${CURL_COMMAND[@]}")" != "OK" ]; then
            echo "Health check failed: HTTP ready endpoint not responding."
            health_check_passed=false
        fi
        for ip in ${LOCALDNS_NODE_LISTENER_IP} ${LOCALDNS_CLUSTER_LISTENER_IP}; do
            if ! dig +short +timeout=${DNS_HEALTH_CHECK_TIMEOUT} +tries=${DNS_HEALTH_CHECK_TRIES} health-check.localdns.local @"${ip}" >/dev/null 2>&1; then
                echo "Health check failed: DNS query to ${ip} failed."
                health_check_passed=false
            fi
        done
        if [ "${health_check_passed}" = true ]; then
            systemd-notify WATCHDOG=1
        else
            echo "localdns health check failed - will be restarted if failures persist."
            current_time=$(date +%s)
            if [ "${sliding_window_start_time}" -eq 0 ] || [ $((current_time - sliding_window_start_time)) -gt "${sliding_window_duration_in_seconds}" ]; then
                sliding_window_start_time=${current_time}
                sliding_window_failure_count=1
            else
                sliding_window_failure_count=$((sliding_window_failure_count + 1))
            fi
            if [ "${sliding_window_failure_count}" -ge "${max_sliding_window_failures}" ]; then
                echo "max sliding window failures (${max_sliding_window_failures} in ${sliding_window_duration_in_seconds}s) reached. Triggering restart."
                systemd-notify WATCHDOG=trigger
                exit ${ERR_LOCALDNS_FAIL}
            fi
        fi
        sleep "${HEALTH_CHECK_INTERVAL}"
    done
else
    wait "${COREDNS_PID}"
fi
