# The devices perfbed's aarch64 QEMU builds in (configure
# --without-default-devices --with-devices-aarch64=perfbed): the `virt`
# board (GICv3, PSCI, PL011, virtio-mmio transports, its device tree) and
# the agent's virtio console, and the device.
CONFIG_ARM_VIRT=y
CONFIG_VIRTIO_SERIAL=y
CONFIG_VIRTIO_MMIO=y
CONFIG_PERFBED=y
