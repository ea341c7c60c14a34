#!/bin/sh
# Time to a hit's first stat, unprivileged (fuse-overlayfs as the daemon for both, 200-file lower):
# (A) user+mount namespace, FUSE mounted inside it by mount(2);
# (B) fusermount3 in the host namespace, then a user+mount namespace that binds it at a view.
# Each: a fresh mount, then the step's nested user namespace stats one file. Teardown untimed.
# Usage: as an unprivileged user with a read-write /dev/fuse: sh scripts/bench-rootless-views.sh
#        as root: sh scripts/bench-rootless-views.sh USER — runs it as USER in a private mount
#        namespace where /dev/fuse is a 0666 node (the host's device is left as it is).
# Needs fuse-overlayfs, fusermount3 and util-linux's unshare (--map-user). N runs per round (25).
set -e
if [ "$(id -u)" = 0 ]; then
  u=${1:?as root, name the unprivileged user to run as}
  d=$(mktemp -d); mount -t tmpfs -o mode=755 lcbench "$d"; mknod -m 666 "$d/fuse" c 10 229
  cp "$0" "$d/bench.sh"; chmod 755 "$d/bench.sh"
  unshare -m --propagation private sh -c "mount --bind $d/fuse /dev/fuse && su -s /bin/sh $u -c 'N=${N:-25} sh $d/bench.sh'" || true
  umount "$d"; rmdir "$d"; exit 0
fi
B=$(mktemp -d /tmp/rlb.XXXX); cd $B
mkdir -p L/d U W M V; for i in $(seq 1 200); do echo $i > L/d/f$i; done
N=${N:-20}; U_=$(id -u); G_=$(id -g)
now() { date +%s%N; }
a() { s=$(now); unshare -Urm sh -c "fuse-overlayfs -o lowerdir=$B/L,upperdir=$B/U,workdir=$B/W $B/M 2>/dev/null && unshare -U --map-user=$U_ --map-group=$G_ stat -c %i $B/M/d/f1 >/dev/null && date +%s%N > $B/t"; e=$(cat $B/t); echo $((e-s)); }
b() { s=$(now); fuse-overlayfs -o lowerdir=$B/L,upperdir=$B/U,workdir=$B/W $B/M 2>/dev/null; unshare -Urm sh -c "mount --bind $B/M $B/V && unshare -U --map-user=$U_ --map-group=$G_ stat -c %i $B/V/d/f1 >/dev/null && date +%s%N > $B/t"; e=$(cat $B/t); fusermount3 -u $B/M; echo $((e-s)); }
med() { sort -n | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]/1000 " us median of " NR}'; }
for r in 1 2; do
  echo "A userns mount:  $(for i in $(seq 1 $N); do a; done | med)"
  echo "B fusermount3+bind: $(for i in $(seq 1 $N); do b; done | med)"
done
cd /; rm -rf $B
