# packaging/Package.cmake — the Debian packages, built with CPack from this
# tree (docs/packaging.md):
#
#   cpack -G DEB            (in a build directory; or: cmake --build . -t package)
#
# makes four packages, one per install component:
#   peercached         (server)  peercached, peercache, peercache-bench, the
#                      sample config as a conffile (/etc/peercache/), the
#                      systemd units, the sysusers.d entry, the docs; its
#                      postinst creates the peercache user and group
#   libpeercache0      (lib)     libpeercache.so.0 (its SONAME)
#   libpeercache-dev   (dev)     peercache.h, the libpeercache.so link,
#                      peercache.pc
#   python3-peercache  (python)  the SGLang shim in /usr/lib/python3/
#                      dist-packages, where Debian's /usr/bin/python3 finds it
# The install prefix of the packages is /usr, whatever the tree was
# configured with (packaging/install_time.cmake writes the files that name
# paths as cpack installs them). Build the packages from a Release tree:
# other build types compile in the test-only fault hooks (docs/disk.md).
#
# Runtime dependencies come from dpkg-shlibdeps (dpkg-dev) on the installed
# binaries, plus the ones it cannot see (adduser, python3, libpeercache0 at
# the same version).

set(PC_PKG_VERSION "${PROJECT_VERSION}")
set(PEERCACHE_DEB_RELEASE "1" CACHE STRING "Debian revision of the packages (Version: X.Y.Z-REV)")
set(PEERCACHE_DEB_MAINTAINER "PeerCache maintainers <maintainers@peercache.invalid>"
    CACHE STRING "Maintainer field of the Debian packages")

# ------------------------------------------------------------ install rules
# The files that name the install prefix, written while installing.
set(PC_INSTALL_TIME_VARS "
  set(PC_SOURCE_DIR \"${CMAKE_SOURCE_DIR}\")
  set(PC_BINARY_DIR \"${CMAKE_BINARY_DIR}\")
  set(PC_LIBDIR \"${CMAKE_INSTALL_LIBDIR}\")
  set(PC_INCLUDEDIR \"${CMAKE_INSTALL_INCLUDEDIR}\")
  set(PC_BINDIR \"${CMAKE_INSTALL_BINDIR}\")
  set(PC_DOCDIR \"${CMAKE_INSTALL_DOCDIR}\")
  set(PC_VERSION \"${PROJECT_VERSION}\")
  include(\"${CMAKE_SOURCE_DIR}/packaging/install_time.cmake\")")
install(CODE "${PC_INSTALL_TIME_VARS}\n  pc_install_node_files()" COMPONENT server)
install(CODE "${PC_INSTALL_TIME_VARS}\n  pc_install_pkgconfig()" COMPONENT dev)
install(FILES README.md DESTINATION ${CMAKE_INSTALL_DOCDIR} COMPONENT server)
install(DIRECTORY docs/ DESTINATION ${CMAKE_INSTALL_DOCDIR} COMPONENT server
        FILES_MATCHING PATTERN "*.md")
# Sample Prometheus alert rules (docs/operations.md).
install(FILES etc/prometheus/peercache.rules.yml
        DESTINATION ${CMAKE_INSTALL_DOCDIR}/prometheus COMPONENT server)

# The shim, with a dist-info so importlib.metadata and pip see it (no RECORD:
# dpkg owns the files, pip must not remove them). Only in the package: a
# `cmake --install` elsewhere uses scripts/install-shim.sh, which knows the
# target interpreter's site directory.
file(STRINGS python/peercache/__init__.py PC_SHIM_VERSION_LINE
     REGEX "^__version__ = \"[^\"]+\"")
string(REGEX REPLACE ".*\"([^\"]+)\".*" "\\1" PC_SHIM_VERSION "${PC_SHIM_VERSION_LINE}")
set(PC_SHIM_INFO "${CMAKE_BINARY_DIR}/packaging/peercache-${PC_SHIM_VERSION}.dist-info")
file(WRITE "${PC_SHIM_INFO}/METADATA"
     "Metadata-Version: 2.1\nName: peercache\nVersion: ${PC_SHIM_VERSION}\n"
     "Summary: PeerCache: the L3 KV-cache store for SGLang HiCache (client shim)\n"
     "Requires-Python: >=3.9\n")
file(WRITE "${PC_SHIM_INFO}/INSTALLER" "dpkg\n")
file(WRITE "${PC_SHIM_INFO}/top_level.txt" "peercache\n")
set(PC_PYDIR lib/python3/dist-packages)
install(DIRECTORY python/peercache DESTINATION ${PC_PYDIR} COMPONENT python
        EXCLUDE_FROM_ALL FILES_MATCHING PATTERN "*.py" PATTERN "__pycache__" EXCLUDE)
install(DIRECTORY ${PC_SHIM_INFO} DESTINATION ${PC_PYDIR} COMPONENT python
        EXCLUDE_FROM_ALL)

# -------------------------------------------------------------------- CPack
set(CPACK_PACKAGE_NAME "peercache")
set(CPACK_PACKAGE_VENDOR "PeerCache")
set(CPACK_PACKAGE_VERSION "${PC_PKG_VERSION}")
# Each package's Description (synopsis, then details) is its component's own.
set(CPACK_PACKAGE_CONTACT "${PEERCACHE_DEB_MAINTAINER}")
set(CPACK_PACKAGING_INSTALL_PREFIX "/usr")
set(CPACK_GENERATOR "DEB")
set(CPACK_PACKAGE_DIRECTORY "${CMAKE_BINARY_DIR}/packages")
set(CPACK_COMPONENTS_ALL server lib dev python)
set(CPACK_DEB_COMPONENT_INSTALL ON)

set(CPACK_DEBIAN_PACKAGE_MAINTAINER "${PEERCACHE_DEB_MAINTAINER}")
set(CPACK_DEBIAN_PACKAGE_RELEASE "${PEERCACHE_DEB_RELEASE}")
set(CPACK_DEBIAN_FILE_NAME DEB-DEFAULT)
set(CPACK_DEBIAN_PACKAGE_PRIORITY "optional")
set(CPACK_DEBIAN_PACKAGE_SHLIBDEPS ON)
# peercache-bench links libpeercache.so.0 from the lib package of this run.
set(CPACK_DEBIAN_PACKAGE_SHLIBDEPS_PRIVATE_DIRS
    "${CMAKE_BINARY_DIR}/client")
set(CPACK_DEBIAN_PACKAGE_CONTROL_STRICT_PERMISSION ON)
# Component dependencies become "Depends: libpeercache0 (= VERSION)".
set(CPACK_DEBIAN_ENABLE_COMPONENT_DEPENDS ON)

set(PC_DEB "${CMAKE_SOURCE_DIR}/packaging/debian")
set(CPACK_COMPONENT_SERVER_DEPENDS lib)
set(CPACK_DEBIAN_SERVER_PACKAGE_NAME "peercached")
set(CPACK_DEBIAN_SERVER_PACKAGE_SECTION "net")
set(CPACK_DEBIAN_SERVER_PACKAGE_DEPENDS "adduser")
set(CPACK_DEBIAN_SERVER_PACKAGE_SUGGESTS "python3-peercache")
string(CONCAT CPACK_DEBIAN_SERVER_DESCRIPTION
    "PeerCache node, operator CLI and benchmark tool\n"
    "peercached keeps LLM KV-cache pages in memory (and on disk) for a cluster of\n"
    "inference hosts; peercache asks a node what it is doing; peercache-bench\n"
    "measures it. The systemd unit peercached.service runs one node per host,\n"
    "peercached@NAME.service several; the config is /etc/peercache/peercached.conf.")
set(CPACK_DEBIAN_SERVER_PACKAGE_CONTROL_EXTRA
    "${PC_DEB}/peercached/conffiles;${PC_DEB}/peercached/postinst;${PC_DEB}/peercached/prerm;${PC_DEB}/peercached/postrm")

set(CPACK_DEBIAN_LIB_PACKAGE_NAME "libpeercache0")
set(CPACK_DEBIAN_LIB_PACKAGE_SECTION "libs")
# A shlibs file: packages built against libpeercache depend on it properly.
set(CPACK_DEBIAN_PACKAGE_GENERATE_SHLIBS ON)
set(CPACK_DEBIAN_PACKAGE_GENERATE_SHLIBS_POLICY ">=")
string(CONCAT CPACK_DEBIAN_LIB_DESCRIPTION
    "PeerCache client library\n"
    "libpeercache talks to the local peercached node over its Unix socket.")

set(CPACK_COMPONENT_DEV_DEPENDS lib)
set(CPACK_DEBIAN_DEV_PACKAGE_NAME "libpeercache-dev")
set(CPACK_DEBIAN_DEV_PACKAGE_SECTION "libdevel")
string(CONCAT CPACK_DEBIAN_DEV_DESCRIPTION
    "PeerCache client library (development files)\n"
    "The header peercache.h, the libpeercache.so link and the pkg-config file\n"
    "peercache.pc.")

set(CPACK_COMPONENT_PYTHON_DEPENDS lib)
set(CPACK_DEBIAN_PYTHON_PACKAGE_NAME "python3-peercache")
set(CPACK_DEBIAN_PYTHON_PACKAGE_SECTION "python")
set(CPACK_DEBIAN_PYTHON_PACKAGE_ARCHITECTURE "all")
set(CPACK_DEBIAN_PYTHON_PACKAGE_DEPENDS "python3 (>= 3.9)")
string(CONCAT CPACK_DEBIAN_PYTHON_DESCRIPTION
    "PeerCache shim for SGLang HiCache (Python 3)\n"
    "The peercache module: SGLang's HiCacheStorage backend on libpeercache.")
set(CPACK_DEBIAN_PYTHON_PACKAGE_CONTROL_EXTRA
    "${PC_DEB}/python3-peercache/postinst;${PC_DEB}/python3-peercache/prerm")

include(CPack)
