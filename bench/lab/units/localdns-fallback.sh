#!/bin/bash
# localdns-fallback.sh: AKS LocalDNS's pod-DNS (.11) fallback, written for the
# lab after the description of AgentBaker PR 9486 (open), not copied.
# localdns-fallback.service runs it when localdns.service fails
# (OnFailure=) or when localdns-fallback-probe.sh saw 3 misses in a row;
# localdns.service's ExecStartPre=-systemctl stop localdns-fallback.service
# hands the traffic back.
#
#   localdns-fallback.sh guard            ExecCondition: decline while
#                                         localdns.service is between restart
#                                         attempts (the PR's guard), so only a
#                                         unit that gave up, or one up but not
#                                         answering, is taken over
#   localdns-fallback.sh start coredns    v1: a second CoreDNS (LocalDNS's own
#                                         binary), minimal Corefile: bind .11,
#                                         forward to the kube-dns ClusterIP
#   localdns-fallback.sh start kubelet    v2: v1 with LocalDNS's own .11 server
#                                         blocks, and kubelet's --cluster-dns
#                                         rewritten to the ClusterIP, kubelet
#                                         restarted
#   localdns-fallback.sh start nat        v3: no listener: nat chain
#                                         LOCALDNS-FALLBACK, first in PREROUTING
#                                         and OUTPUT: .11 to kube-proxy's
#                                         kube-dns service chain, .10 to the
#                                         VNet DNS server
#   localdns-fallback.sh stop nat         v3's ExecStop: the chain removed
#   localdns-fallback.sh revert-kubelet   v2's ExecStartPost of localdns.service:
#                                         --cluster-dns back to 169.254.10.11
#
# Configured by /etc/localdns/environment (COREDNS_BINARY_PATH,
# UPDATED_LOCALDNS_CORE_FILE, LINK_KIND, COREDNS_SERVICE_IP: the kube-dns
# ClusterIP, 10.0.0.10 when unset).
set -euo pipefail

LOCALDNS_NODE_LISTENER_IP="169.254.10.10"
LOCALDNS_CLUSTER_LISTENER_IP="169.254.10.11"
COREDNS_SERVICE_IP="${COREDNS_SERVICE_IP:-10.0.0.10}"
COREDNS_BINARY_PATH="${COREDNS_BINARY_PATH:-/opt/azure/containers/localdns/binary/coredns}"
UPDATED_LOCALDNS_CORE_FILE="${UPDATED_LOCALDNS_CORE_FILE:-/opt/azure/containers/localdns/updated.localdns.corefile}"
LINK_KIND="${LINK_KIND:-dummy}"
FALLBACK_DIR="/run/localdns-fallback"
FALLBACK_COREFILE="${FALLBACK_DIR}/Corefile"
KUBELET_DEFAULTS="${KUBELET_DEFAULTS:-/etc/default/kubelet}"
RESOLV_CONF="${RESOLV_CONF:-/run/systemd/resolve/resolv.conf}"
CHAIN="LOCALDNS-FALLBACK"
# How kube-proxy's comments on its kube-dns rules in KUBE-SERVICES begin
# (":dns cluster IP" for udp, ":dns-tcp cluster IP" for tcp).
KUBE_DNS_COMMENT="kube-system/kube-dns:dns"

log() { echo "localdns-fallback: $*"; }

# ensure_listener_ip puts .11 on the localdns link, creating the link if
# LocalDNS's cleanup deleted it.
ensure_listener_ip() {
    if ! ip link show dev localdns >/dev/null 2>&1; then
        ip link add name localdns type "${LINK_KIND}"
    fi
    ip link set up dev localdns
    if ! ip -4 addr show dev localdns | grep -qF " ${LOCALDNS_CLUSTER_LISTENER_IP}/"; then
        ip addr add "${LOCALDNS_CLUSTER_LISTENER_IP}/32" dev localdns
    fi
}

# pod_blocks prints LocalDNS's server blocks that bind .11, bound to .11 alone.
pod_blocks() {
    awk -v ip="${LOCALDNS_CLUSTER_LISTENER_IP}" '
        /^[^#[:space:]].*\{[[:space:]]*$/ { inblk = 1; keep = 0; buf = $0 ORS; next }
        inblk {
            if ($1 == "bind") { for (i = 2; i <= NF; i++) if ($i == ip) keep = 1; sub(/bind .*/, "bind " ip) }
            buf = buf $0 ORS
            if ($0 ~ /^}/) { if (keep) printf "%s", buf; inblk = 0 }
        }' "${UPDATED_LOCALDNS_CORE_FILE}"
}

set_cluster_dns() {
    local to="$1"
    [ -f "${KUBELET_DEFAULTS}" ] || return 0
    if grep -q -- "--cluster-dns=${to}\b" "${KUBELET_DEFAULTS}"; then
        return 0
    fi
    sed -i -E "s/--cluster-dns=[0-9.]+/--cluster-dns=${to}/" "${KUBELET_DEFAULTS}"
    log "kubelet --cluster-dns set to ${to}; restarting kubelet."
    systemctl restart kubelet.service
}

start_coredns() {
    local design="$1"
    mkdir -p "${FALLBACK_DIR}"
    if [ "${design}" = kubelet ]; then
        pod_blocks >"${FALLBACK_COREFILE}"
    else
        printf '.:53 {\n    bind %s\n    errors\n    forward . %s\n}\n' "${LOCALDNS_CLUSTER_LISTENER_IP}" "${COREDNS_SERVICE_IP}" >"${FALLBACK_COREFILE}"
    fi
    ensure_listener_ip
    if [ "${design}" = kubelet ]; then
        set_cluster_dns "${COREDNS_SERVICE_IP}"
    fi
    log "taking over ${LOCALDNS_CLUSTER_LISTENER_IP} (design ${design}): CoreDNS forwarding to ${COREDNS_SERVICE_IP}."
    exec "${COREDNS_BINARY_PATH}" -conf "${FALLBACK_COREFILE}"
}

remove_chain() {
    local hook
    for hook in PREROUTING OUTPUT; do
        while iptables -w -t nat -D "${hook}" -j "${CHAIN}" 2>/dev/null; do :; done
    done
    if iptables -w -t nat -n -L "${CHAIN}" >/dev/null 2>&1; then
        iptables -w -t nat -F "${CHAIN}"
        iptables -w -t nat -X "${CHAIN}"
    fi
}

start_nat() {
    local proto svc vnet
    vnet=$(awk '/^nameserver/ && $2 != "'"${LOCALDNS_NODE_LISTENER_IP}"'" {print $2; exit}' "${RESOLV_CONF}" 2>/dev/null || true)
    remove_chain
    iptables -w -t nat -N "${CHAIN}"
    for proto in udp tcp; do
        svc=$(iptables -w -t nat -S KUBE-SERVICES 2>/dev/null | grep -F -- "${KUBE_DNS_COMMENT}" | grep -- "-p ${proto}" | sed -n 's/.*-j \(KUBE-SVC-[A-Z0-9]*\).*/\1/p' | head -n1)
        if [ -n "${svc}" ]; then
            iptables -w -t nat -A "${CHAIN}" -d "${LOCALDNS_CLUSTER_LISTENER_IP}/32" -p "${proto}" --dport 53 -j "${svc}"
        else
            log "no kube-proxy chain for kube-dns (${proto}); ${LOCALDNS_CLUSTER_LISTENER_IP} left alone."
        fi
        if [ -n "${vnet}" ]; then
            iptables -w -t nat -A "${CHAIN}" -d "${LOCALDNS_NODE_LISTENER_IP}/32" -p "${proto}" --dport 53 -j DNAT --to-destination "${vnet}:53"
        fi
    done
    iptables -w -t nat -I PREROUTING 1 -j "${CHAIN}"
    iptables -w -t nat -I OUTPUT 1 -j "${CHAIN}"
    log "taking over ${LOCALDNS_CLUSTER_LISTENER_IP} (design nat): ${CHAIN} to ${svc:-nothing}, ${LOCALDNS_NODE_LISTENER_IP} to ${vnet:-nothing}."
}

case "${1:-}" in
guard)
    sub=$(systemctl show -P SubState localdns.service)
    if [ "${sub}" = auto-restart ]; then
        log "localdns.service is between restart attempts; not taking over ${LOCALDNS_CLUSTER_LISTENER_IP} yet."
        exit 1
    fi
    ;;
start)
    case "${2:-}" in
    coredns | kubelet) start_coredns "$2" ;;
    nat) start_nat ;;
    *) echo "usage: $0 start coredns|kubelet|nat" >&2; exit 2 ;;
    esac
    ;;
stop)
    [ "${2:-}" = nat ] && remove_chain
    log "handed ${LOCALDNS_CLUSTER_LISTENER_IP} back."
    ;;
revert-kubelet)
    set_cluster_dns "${LOCALDNS_CLUSTER_LISTENER_IP}"
    ;;
*)
    echo "usage: $0 guard | start DESIGN | stop DESIGN | revert-kubelet" >&2
    exit 2
    ;;
esac
