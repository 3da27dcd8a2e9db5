# packaging/install_time.cmake — install rules that need the install prefix.
#
# Included by the install(CODE) rules of packaging/Package.cmake and
# client/CMakeLists.txt, i.e. while `cmake --install` or cpack runs, not at
# configure time: cpack installs into /usr whatever prefix the tree was
# configured with (and `cmake --install --prefix` may change it too), so the
# files that name paths (the pkg-config file, the systemd units) and the one
# that lives outside the prefix (the sample config) are written here, from
# CMAKE_INSTALL_PREFIX as it is now. file(INSTALL) adds DESTDIR itself.
#
# In (set by the install(CODE) that includes this): PC_SOURCE_DIR,
# PC_BINARY_DIR, PC_LIBDIR, PC_INCLUDEDIR, PC_BINDIR, PC_DOCDIR (relative,
# from GNUInstallDirs) and PC_VERSION.

# /etc for the system prefixes (GNUInstallDirs' rule for the full
# SYSCONFDIR), PREFIX/etc otherwise.
if(CMAKE_INSTALL_PREFIX STREQUAL "/usr" OR CMAKE_INSTALL_PREFIX STREQUAL "/")
  set(PC_SYSCONFDIR "/etc")
else()
  set(PC_SYSCONFDIR "${CMAKE_INSTALL_PREFIX}/etc")
endif()
foreach(d LIBDIR INCLUDEDIR BINDIR DOCDIR)
  if(IS_ABSOLUTE "${PC_${d}}")
    set(PC_FULL_${d} "${PC_${d}}")
  else()
    set(PC_FULL_${d} "${CMAKE_INSTALL_PREFIX}/${PC_${d}}")
  endif()
endforeach()

# Configure SRC (@VAR@ only) as NAME and install it into DIR.
function(pc_install_configured src dir name)
  set(staged "${PC_BINARY_DIR}/install-time/${name}")
  configure_file("${src}" "${staged}" @ONLY)
  file(INSTALL "${staged}" DESTINATION "${dir}")
endfunction()

# The node's files outside bin/: the sample config, the two units, the
# sysusers.d entry for the peercache user.
function(pc_install_node_files)
  file(INSTALL "${PC_SOURCE_DIR}/etc/peercached.conf"
       DESTINATION "${PC_SYSCONFDIR}/peercache")
  set(PC_BINDIR "${PC_FULL_BINDIR}")
  set(PC_DOCDIR "${PC_FULL_DOCDIR}")
  set(units "${CMAKE_INSTALL_PREFIX}/lib/systemd/system")
  set(PC_UNIT_NAME "peercached.service")
  set(PC_UNIT_WHAT "the PeerCache node, one per host")
  set(PC_UNIT_DESC "")
  set(PC_UNIT_CONF "${PC_SYSCONFDIR}/peercache/peercached.conf")
  set(PC_UNIT_ENV "")
  set(PC_UNIT_RUNDIR "peercache")
  set(PC_UNIT_STATEDIR "peercache")
  pc_install_configured("${PC_SOURCE_DIR}/packaging/peercached.service.in"
                        "${units}" "peercached.service")
  set(PC_UNIT_NAME "peercached@.service")
  set(PC_UNIT_WHAT "node NAME of several on one host (peercached@NAME)")
  set(PC_UNIT_DESC " %i")
  set(PC_UNIT_CONF "${PC_SYSCONFDIR}/peercache/%i.conf")
  # The file's `socket` would be the same for every node: the unit sets
  # each one's (the environment wins over the file).
  set(PC_UNIT_ENV "Environment=PEERCACHE_SOCKET=/run/peercache-%i/peercached.sock\n")
  set(PC_UNIT_RUNDIR "peercache-%i")
  set(PC_UNIT_STATEDIR "peercache/%i")
  pc_install_configured("${PC_SOURCE_DIR}/packaging/peercached.service.in"
                        "${units}" "peercached@.service")
  file(INSTALL "${PC_SOURCE_DIR}/packaging/sysusers.conf"
       DESTINATION "${CMAKE_INSTALL_PREFIX}/lib/sysusers.d"
       RENAME "peercache.conf")
endfunction()

# libpeercache's pkg-config file (client/peercache.pc.in).
function(pc_install_pkgconfig)
  set(CMAKE_INSTALL_LIBDIR "${PC_LIBDIR}")
  set(CMAKE_INSTALL_INCLUDEDIR "${PC_INCLUDEDIR}")
  set(PROJECT_VERSION "${PC_VERSION}")
  pc_install_configured("${PC_SOURCE_DIR}/client/peercache.pc.in"
                        "${PC_FULL_LIBDIR}/pkgconfig" "peercache.pc")
endfunction()
