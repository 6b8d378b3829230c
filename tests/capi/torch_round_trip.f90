! The Fortran side of torch_round_trip_test.sh: on a communicator split from MPI_COMM_WORLD (every rank), builds
! the model of the JSON description DESCRIPTION through the module ddp, loads PyTorch's weights
! DIR/offline.safetensors, and writes its ddp_predict outputs on DIR/inputs.bin to DIR/f_offline.bin (rank 0),
! which the test compares with PyTorch's.
!
!   mpirun -np 2 torch_round_trip_f DESCRIPTION DIR
program torch_round_trip_f
  use mpi
  use ddp
  use, intrinsic :: iso_c_binding, only: c_float, c_int64_t
  implicit none
  integer :: ierr, provided, rank, comm, status, unit, bytes
  integer(c_int64_t) :: in, out, rows
  type(ddp_session) :: session
  type(ddp_model) :: model
  character(len=4096) :: description_path, dir
  character(len=:), allocatable :: description
  real(c_float), allocatable :: x(:, :), y(:, :)

  call MPI_Init_thread(MPI_THREAD_MULTIPLE, provided, ierr)
  call MPI_Comm_rank(MPI_COMM_WORLD, rank, ierr)
  call MPI_Comm_split(MPI_COMM_WORLD, 0, rank, comm, ierr)
  call get_command_argument(1, description_path)
  call get_command_argument(2, dir)

  open(newunit=unit, file=trim(description_path), access="stream", form="unformatted", status="old")
  inquire(unit=unit, size=bytes)
  allocate(character(len=bytes) :: description)
  read(unit) description
  close(unit)

  call check(ddp_session_create(comm, "cpu", session), "ddp_session_create")
  call check(ddp_model_create_from_json(session, description, 0_c_int64_t, model), "ddp_model_create_from_json")
  call check(ddp_model_input_size(model, in), "ddp_model_input_size")
  call check(ddp_model_output_size(model, out), "ddp_model_output_size")
  call check(ddp_model_load_weights(model, trim(dir) // "/offline.safetensors"), "ddp_model_load_weights")

  open(newunit=unit, file=trim(dir) // "/inputs.bin", access="stream", form="unformatted", status="old")
  inquire(unit=unit, size=bytes)
  rows = bytes / 4 / in
  allocate(x(in, rows), y(out, rows))
  read(unit) x
  close(unit)
  call check(ddp_predict(model, x, y), "ddp_predict")
  if (rank == 0) then
    open(newunit=unit, file=trim(dir) // "/f_offline.bin", access="stream", form="unformatted", status="replace")
    write(unit) y
    close(unit)
  end if

  call check(ddp_model_destroy(model), "ddp_model_destroy")
  call check(ddp_session_destroy(session), "ddp_session_destroy")
  call MPI_Comm_free(comm, ierr)
  if (rank == 0) print "(a)", "torch_round_trip_f: OK"
  call MPI_Finalize(ierr)

contains

  subroutine check(code, call)
    integer, intent(in) :: code
    character(len=*), intent(in) :: call
    if (code /= DDP_OK) then
      print "(a, i0, 4a)", "rank ", rank, ": ", call, " failed: ", trim(ddp_last_error())
      call MPI_Abort(MPI_COMM_WORLD, 1, ierr)
    end if
  end subroutine

end program
