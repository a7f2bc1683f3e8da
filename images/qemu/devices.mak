# The devices perfbed's minimal QEMU builds in (configure
# --without-default-devices --with-devices-x86_64=perfbed). microvm is the
# only machine: every QEMU boot perfbed makes (the guest, the box's L1, the
# bench's) is microvm, so no PC machine (I440FX: IDE, PS/2, the floppy,
# SMBus, SMBIOS); 0002-hw-acpi-no-pc_madt_cpu_entry-stub.patch makes that
# build link.
CONFIG_MICROVM=y
CONFIG_VIRTIO_SERIAL=y
CONFIG_VIRTIO_MMIO=y
CONFIG_SERIAL_ISA=y
CONFIG_ISA_DEBUG=y
CONFIG_PERFBED=y
