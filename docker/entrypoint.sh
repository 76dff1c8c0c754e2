#!/bin/sh
# roq-entrypoint ROLE [args]: zookeeper | gcm | hcm | anything else is exec'd as is.
# Daemons bind every interface and advertise this container's address, so clients
# outside the container (tests on the Docker host) can reach them.
set -e
role=${1:-}
[ $# -gt 0 ] && shift
ip=$(hostname -i | awk '{print $1}')
case "$role" in
  zookeeper)
    # ZK_ID=1 ZK_SERVERS="1=10.0.0.2,2=10.0.0.3,3=10.0.0.4" (omit for a standalone node)
    mkdir -p /var/lib/roq-zk
    echo "${ZK_ID:-1}" > /var/lib/roq-zk/myid
    {
      echo "tickTime=${ZK_TICK_MS:-250}"
      echo "initLimit=40"
      echo "syncLimit=20"
      echo "dataDir=/var/lib/roq-zk"
      echo "clientPort=2181"
      echo "minSessionTimeout=1000"
      echo "maxSessionTimeout=60000"
      echo "autopurge.snapRetainCount=3"
      echo "autopurge.purgeInterval=1"
      echo "admin.enableServer=false"
      echo "4lw.commands.whitelist=ruok,srvr,stat,mntr"
      echo "reconfigEnabled=false"
      echo "quorumListenOnAllIPs=true"
      echo "$ZK_SERVERS" | tr ',' '\n' | awk -F= 'NF == 2 {print "server." $1 "=" $2 ":2888:3888"}'
    } > /var/lib/roq-zk/zoo.cfg
    exec /usr/share/zookeeper/bin/zkServer.sh start-foreground /var/lib/roq-zk/zoo.cfg
    ;;
  gcm)
    exec roq-gcm --set gcm.bind=0.0.0.0 --set "gcm.advertise=$ip" --set gcm.port=5500 "$@"
    ;;
  hcm)
    exec roq-hcm --set hcm.bind=0.0.0.0 --set "hcm.advertise=$ip" --set "hcm.host=${ROQ_HCM_HOST:-$(hostname)}" "$@"
    ;;
  *)
    exec "$role" "$@"
    ;;
esac
