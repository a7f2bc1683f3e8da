# The devices perfbed's minimal QEMU builds in (configure
# --without-default-devices --with-devices-x86_64=perfbed).
CONFIG_I440FX=y
CONFIG_MICROVM=y
CONFIG_VIRTIO_SERIAL=y
CONFIG_VIRTIO_MMIO=y
CONFIG_SERIAL_ISA=y
CONFIG_ISA_DEBUG=y
CONFIG_PERFBED=y
