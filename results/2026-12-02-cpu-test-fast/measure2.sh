#!/bin/bash
# measure2.sh DIR JOBS : own temp root per tree; base primed with 3 full old sessions (its steady state)
cd "$1" || exit 1
name=$(basename $1)
root=/tmp/h2prof/tr-$name
if [ "$name" = h2base ]; then
  rm -rf $root; mkdir -p $root/pytest-of-root
  for i in 1 2 3; do cp -a /tmp/h2prof/tpl/session $root/pytest-of-root/pytest-$i; done
else
  mkdir -p $root
fi
find . -path ./.venv -prune -o -name __pycache__ -type d -print | xargs rm -rf
sync
l0=$(cut -d' ' -f1 /proc/loadavg)
out=$( { PYTEST_DEBUG_TEMPROOT=$root /usr/bin/time -f "TIME %e %U %S" .venv/bin/python -m pytest -m "not slow" -n "$2" -q -p no:cacheprovider 2>&1; } | tee /tmp/h2prof/last-$name-$2.txt | grep -E "TIME|passed|failed" | tr "\n" " ")
l1=$(cut -d' ' -f1 /proc/loadavg)
echo "$(date -u +%H:%M:%S) $name n=$2 load=$l0/$l1 :: $out" | tee -a /tmp/h2prof/measure2.log
