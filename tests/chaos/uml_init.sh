#!/bin/sh
# PID 1 of a User-Mode Linux kernel booted on the host's filesystem (tests/chaos/test_netem_uml.py):
# gives it its own /proc, /sys, /dev and a /run on tmpfs (namespaces, ledgers and temporary
# files stay inside the kernel), loads the modules the netem tests need from the package's
# own tree, runs the command file $CHAOS_UML_OUT/command, writes its exit code beside it and
# powers off. The kernel passes its command line's unknown KEY=VALUE words here as environment.
export PATH=/usr/sbin:/usr/bin:/sbin:/bin TMPDIR=/run/tmp
mount -t proc proc /proc
mount -t sysfs sysfs /sys
mount -t devtmpfs devtmpfs /dev
mount -t tmpfs tmpfs /run
mkdir -p /run/tmp /run/uml/lib
ln -s /usr/lib/uml/modules /run/uml/lib/modules  # modprobe -d reads DIR/lib/modules/RELEASE
{
    modprobe -d /run/uml -a sch_netem veth bridge && sh "$CHAOS_UML_OUT/command"
    echo $? > "$CHAOS_UML_OUT/rc"
} > "$CHAOS_UML_OUT/log" 2>&1
sync
poweroff -f
